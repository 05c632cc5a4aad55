"""Preference pairs from files users bring: HF `datasets` reads them, this module tokenizes and accounts for bad rows.

    arrays, report = read_pair_file("gs://b/prefs.jsonl", tokenizer, max_prompt_length=512, max_length=1024,
                                    max_bad_fraction=0.01, chat_template=template, special_tokens=tokens)
    # arrays: tokens [N, 2, L] (uint16 when the ids fit), answer [N, 2, L] int8 (see jaxpod.data.pairs)
    # report: {"rows", "pairs", "bad", "bad_rows": {row: reason, ...first 20}, "truncated"}

Formats (TRL's): a row has `chosen` and `rejected` and usually `prompt`, each plain text or a list of
chat messages (`[{"role": "user", "content": ...}, ...]`). Message lists are rendered with the
tokenizer's chat template (`jaxpod.data.chat`); the answer is what the conversation renders after the
prompt with its generation prompt. Text answers get EOS appended (TRL does the same), so EOS's
log-prob is part of the answer. Without `prompt`, the prompt is implicit: the messages chosen and
rejected share before they differ.

Truncation (stated, as TRL): a prompt longer than `max_prompt_length` keeps its last tokens; an
answer that does not fit in `max_length` with its prompt loses its end. Both are counted, not bad.
A bad row (missing or malformed column, empty answer, identical answers, chosen and rejected
rendering different prompts, a template that refuses the messages) is skipped and named by its row
number (0-based, in file order); more than `max_bad_fraction` bad rows refuse the whole file
before any training starts.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from jaxpod.data.pairs import encode_pair, stack_pairs


class BadRow(ValueError):
  """Why one row cannot become a pair (the message is the reason)."""


def load_rows(path: str):
  """The file as a HF `datasets.Dataset` (JSONL / JSON, Parquet, Arrow; local or any fsspec URL)."""
  from jaxpod.data.user_files import load_table
  return load_table(path, label="pair file (task.data.path)")


def _is_messages(value: Any) -> bool:
  return isinstance(value, list) and all(isinstance(m, dict) and "role" in m for m in value)


def _text_ids(tokenizer, text: str, bos: bool) -> list[int]:
  ids = tokenizer.encode(text)
  if not bos and ids and tokenizer.bos_id is not None and ids[0] == tokenizer.bos_id:
    ids = ids[1:]
  return ids


def _render(row: dict, template: str | None, special_tokens: dict | None) -> tuple[str, str, str]:
  """(prompt text, chosen answer text, rejected answer text) of a message-list row."""
  from jaxpod.data.chat import ChatTemplateError, split_prompt_answer
  if template is None:
    raise BadRow("chat messages but the tokenizer has no chat template (set task.data.tokenizer to a folder "
                 "with one)")
  chosen, rejected = list(row["chosen"]), list(row["rejected"])
  prompt = row.get("prompt")
  if prompt is None:  # implicit prompt: the shared leading messages
    shared = 0
    while shared < min(len(chosen), len(rejected)) - 1 and chosen[shared] == rejected[shared]:
      shared += 1
    if shared == 0:
      raise BadRow("chosen and rejected render different prompts (no leading message in common, no prompt column)")
    prompt, chosen, rejected = chosen[:shared], chosen[shared:], rejected[shared:]
  elif not _is_messages(prompt):
    raise BadRow("prompt is not a list of chat messages while chosen/rejected are")
  try:
    p_chosen, a_chosen = split_prompt_answer(template, prompt, chosen, special_tokens=special_tokens)
    p_rejected, a_rejected = split_prompt_answer(template, prompt, rejected, special_tokens=special_tokens)
  except ChatTemplateError as e:
    raise BadRow(str(e)) from None
  if p_chosen != p_rejected:
    raise BadRow("chosen and rejected render different prompts")
  return p_chosen, a_chosen, a_rejected


def _common_prefix(a: str, b: str) -> str:
  import os
  return os.path.commonprefix([a, b])


def row_to_pair(row: dict, tokenizer, max_prompt_length: int, max_length: int, template: str | None = None,
                special_tokens: dict | None = None) -> tuple[dict, bool]:
  """(encode_pair arrays, whether it was truncated) of one row; BadRow says why a row cannot be used."""
  for column in ("chosen", "rejected"):
    if row.get(column) is None:
      raise BadRow(f"missing column {column!r}")
  chat = _is_messages(row["chosen"]) and _is_messages(row["rejected"])
  if chat:
    prompt_text, chosen_text, rejected_text = _render(row, template, special_tokens)
    prompt = _text_ids(tokenizer, prompt_text, bos=not prompt_text.startswith(str((special_tokens or {}).get(
        "bos_token") or "\0")))
    eos: list[int] = []  # the template ends the answer itself (e.g. <|eot_id|>)
  else:
    values = [row.get("prompt") or "", row["chosen"], row["rejected"]]
    if not all(isinstance(v, str) for v in values):
      raise BadRow("prompt/chosen/rejected must all be text or all chat message lists")
    prompt_text, chosen_text, rejected_text = values
    if row.get("prompt") is None:  # implicit prompt: the text chosen and rejected share
      shared = len(_common_prefix(chosen_text, rejected_text))
      prompt_text, chosen_text, rejected_text = chosen_text[:shared], chosen_text[shared:], rejected_text[shared:]
    prompt = _text_ids(tokenizer, prompt_text, bos=True)
    eos = [tokenizer.eos_ids[0]] if tokenizer.eos_ids else []
  if not chosen_text.strip() or not rejected_text.strip():
    raise BadRow("empty answer")
  if chosen_text == rejected_text:
    raise BadRow("chosen and rejected are identical")
  truncated = len(prompt) > max_prompt_length
  prompt = prompt[-max_prompt_length:]
  room = max_length - len(prompt)
  answers = []
  for text in (chosen_text, rejected_text):
    ids = _text_ids(tokenizer, text, bos=False) + eos
    truncated |= len(ids) > room
    answers.append(ids[:room])
  return encode_pair(prompt, answers[0], answers[1], max_length, tokenizer.pad_id or 0), truncated


def read_pair_file(path: str, tokenizer, max_prompt_length: int, max_length: int, max_bad_fraction: float, *,
                   chat_template: str | None = None, special_tokens: dict | None = None,
                   rows: Sequence[dict] | None = None) -> tuple[dict, dict]:
  """Every good row of `path` as pair arrays, and the report; ValueError when too many rows are bad."""
  rows = load_rows(path) if rows is None else rows
  pairs, bad, truncated = [], {}, 0
  for number, row in enumerate(rows):
    try:
      pair, cut = row_to_pair(dict(row), tokenizer, max_prompt_length, max_length, chat_template, special_tokens)
    except BadRow as e:
      bad[number] = str(e)
      continue
    pairs.append(pair)
    truncated += cut
  total = len(pairs) + len(bad)
  first = "; ".join(f"row {n}: {why}" for n, why in list(bad.items())[:3])
  if total == 0 or len(bad) > max_bad_fraction * total:
    raise ValueError(f"{path}: {len(bad)} of {total} rows are bad ({first or 'the file has no rows'}), more than "
                     f"task.data.max_bad_fraction={max_bad_fraction}; fix the rows or raise the fraction")
  arrays = stack_pairs(pairs)
  if int(arrays["tokens"].max()) < 2 ** 16:
    arrays["tokens"] = arrays["tokens"].astype(np.uint16)  # half the bytes every host reads
  report = {"rows": total, "pairs": len(pairs), "bad": len(bad), "truncated": truncated,
            "bad_rows": {str(n): why for n, why in list(bad.items())[:20]}}
  return arrays, report
