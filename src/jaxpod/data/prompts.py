"""Prompt datasets users bring: prompts with reference answers from files HF `datasets` reads.

    spec = PromptSource("gs://bucket/gsm8k/train.jsonl", prompt_column="question", answer_column="answer")
    rows = read_prompts(spec)                          # every row, as PromptRow(row, prompt, answer)
    rows = read_prompts(spec, shard=(host, hosts))     # one host's contiguous slice of the rows
    held_out, train = split_held_out(rows, eval_size=256)

Files: JSONL (`.jsonl`, `.json`) or Parquet (`.parquet`), local or any fsspec URL (gs://, s3://,
memory://), read by `datasets` (the `datasets` extra). A prompt is text, or a list of chat
messages ({"role", "content"}) that `render_prompt` turns into text with the model's chat template
(`jaxpod.data.chat`); text goes through a plain format string (`"Question: {prompt}\\nAnswer:"`).
Answers are strings or numbers (a number becomes its decimal text).

The held-out split is a property of the file, not of the run: the `eval_size` distinct prompts
with the smallest SHA-256 of their text, so every run, seed and host holds out the same
problems, and a training row whose prompt equals a held-out one is dropped too (duplicates
never leak the held-out set into training). A separate held-out file replaces the hash split.

Errors name the file, the row number (0-based, as `datasets` counts) and the column.

Prompts without answers (`jaxpod sample`, `jaxpod extract`) come from a plain prompt list that needs no
`datasets`: `read_prompt_file(url, "sample.prompts")`, one prompt per non-empty line of a text file, or one
JSON object per line of a `.jsonl` file (its fields kept: a per-request "seed", say).
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Mapping, Sequence

FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


class PromptDataError(ValueError):
  """A prompt file that cannot be read or holds a bad row; the message is one line naming file and row."""


@dataclasses.dataclass(frozen=True)
class PromptSource:
  """Where the prompts are and which columns hold them."""

  path: str  # JSONL or Parquet file (local path or URL)
  prompt_column: str = "prompt"  # text, or a list of chat messages
  answer_column: str = "answer"  # the reference answer the reward checks
  fields: str = ""  # how the caller's config names these fields in errors, e.g. "rl.problems."


@dataclasses.dataclass(frozen=True)
class PromptRow:
  """One row of a prompt file."""

  row: int  # row number in the file (0-based)
  prompt: Any  # str, or a list of {"role", "content"} messages
  answer: str


def read_prompt_file(url: str, field: str, keys: Sequence[str] = ("prompt",),
                     messages: bool = False) -> list[dict]:
  """Records of a prompt list, each with "prompt": the line of a text file, or the first of `keys` that a .jsonl
  object holds as text (with `messages`, else its "messages" list); errors name `field`, the file and the line."""
  import json
  import fsspec
  with fsspec.open(url, "r", encoding="utf-8") as f:
    lines = f.read().splitlines()
  if not url.endswith(".jsonl"):
    return [{"prompt": line} for line in lines if line.strip()]
  want = " or ".join(repr(k) for k in keys) + (" string or a 'messages' list" if messages else " string")
  out = []
  for n, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      row = json.loads(line)
    except ValueError as e:
      raise PromptDataError(f"{field}={url} line {n} is not JSON ({e}); one object per line") from None
    prompt = next((row[k] for k in keys if isinstance(row.get(k), str)), None) if isinstance(row, dict) else None
    if prompt is None and messages and isinstance(row, dict) and isinstance(row.get("messages"), list):
      prompt = row["messages"]
    if prompt is None:
      raise PromptDataError(f"{field}={url} line {n}: expected an object with a {want}")
    out.append({**row, "prompt": prompt})
  return out


def _load(path: str):
  from jaxpod.data.user_files import load_table
  return load_table(path, builders=FORMATS, label="prompt file", error=PromptDataError)


def _answer(value: Any, where: str) -> str:
  if isinstance(value, bool) or value is None:
    raise PromptDataError(f"{where}: the answer is {value!r}; give a string or a number")
  if isinstance(value, (int, float)):
    return str(value)
  if not isinstance(value, str) or not value.strip():
    raise PromptDataError(f"{where}: the answer is {value!r:.60}; give a non-empty string or a number")
  return value


def _prompt(value: Any, where: str) -> Any:
  if isinstance(value, str):
    if not value.strip():
      raise PromptDataError(f"{where}: the prompt is empty")
    return value
  if isinstance(value, Sequence) and value and all(isinstance(m, Mapping) and "role" in m for m in value):
    return [dict(m) for m in value]
  raise PromptDataError(f"{where}: the prompt is {value!r:.60}; give text or a non-empty list of "
                        "{'role': ..., 'content': ...} messages")


def read_prompts(source: PromptSource, shard: tuple[int, int] = (0, 1)) -> list[PromptRow]:
  """The rows of `source` (with shard=(i, count): only the i-th of `count` contiguous slices), checked."""
  index, count = shard
  if not 0 <= index < count:
    raise ValueError(f"shard={shard}: the index must be in 0..count-1")
  ds = _load(source.path)
  for field, column in (("prompt_column", source.prompt_column), ("answer_column", source.answer_column)):
    if column not in ds.column_names:
      raise PromptDataError(f"{source.path} has no column {column!r} (it has {', '.join(ds.column_names)}); "
                            f"set {source.fields}{field}")
  if len(ds) == 0:
    raise PromptDataError(f"{source.path} holds no rows")
  start, stop = slice_bounds(len(ds), index, count)
  part = ds.select_columns([source.prompt_column, source.answer_column]).select(range(start, stop))
  out = []
  for row, record in enumerate(part, start=start):
    where = f"{source.path} row {row}"
    out.append(PromptRow(row, _prompt(record[source.prompt_column], f"{where} column {source.prompt_column!r}"),
                         _answer(record[source.answer_column], f"{where} column {source.answer_column!r}")))
  return out


def slice_bounds(rows: int, index: int, count: int) -> tuple[int, int]:
  """[start, stop) of slice `index` of `count` near-equal contiguous slices of `rows` rows."""
  return rows * index // count, rows * (index + 1) // count


def prompt_key(prompt: Any) -> str:
  """The text a prompt is identified by (messages: their roles and contents)."""
  if isinstance(prompt, str):
    return prompt
  return "\x1e".join(f"{m.get('role')}\x1f{m.get('content')}" for m in prompt)


def _rank(prompt: Any) -> bytes:
  return hashlib.sha256(prompt_key(prompt).encode()).digest()


def split_held_out(rows: Sequence[PromptRow], eval_size: int,
                   held_out: Sequence[PromptRow] | None = None) -> tuple[list[PromptRow], list[PromptRow]]:
  """(held-out rows, training rows): `held_out` if given, else the eval_size distinct prompts of smallest
  hash; training rows are the others, any whose prompt is held out dropped (see the module docstring)."""
  if held_out is None:
    distinct = {}
    for r in sorted(rows, key=lambda r: (_rank(r.prompt), r.row)):
      distinct.setdefault(prompt_key(r.prompt), r)
    if len(distinct) <= eval_size:
      raise PromptDataError(f"the prompt file has {len(distinct)} distinct prompts, not more than eval_size="
                            f"{eval_size}; lower eval_size so that some remain to train on")
    held_out = sorted(list(distinct.values())[:eval_size], key=lambda r: r.row)
  else:
    held_out = list(held_out)[:eval_size]
  keys = {prompt_key(r.prompt) for r in held_out}
  train = [r for r in rows if prompt_key(r.prompt) not in keys]
  if not train:
    raise PromptDataError("every training prompt is also held out; give a held-out file with other prompts")
  return held_out, train


def render_prompt(prompt: Any, prompt_format: str, template: str | None, special_tokens: Mapping[str, str],
                  where: str) -> str:
  """The text the policy is given: text through `prompt_format`, messages through the chat template."""
  if isinstance(prompt, str):
    return prompt_format.format(prompt=prompt)
  if template is None:
    raise PromptDataError(f"{where}: the prompt is a list of chat messages but no chat template was found; set "
                          "chat_template to a folder with the tokenizer's template (or give prompts as text)")
  from jaxpod.data.chat import render_chat
  return render_chat(template, prompt, add_generation_prompt=True, special_tokens=special_tokens, where=where)
