"""Chat templates: message lists rendered with the Jinja template a tokenizer's files carry.

    template = load_chat_template("gs://bucket/qwen")          # None if the files carry none
    tokens = load_special_tokens("gs://bucket/qwen")           # {"bos_token": "<s>", ...}
    text = render_chat(template, messages, add_generation_prompt=True, special_tokens=tokens)

Rendering follows transformers' `apply_chat_template(..., tokenize=False)` so that a prompt
rendered here tokenizes to the ids the model was trained on: the template's own text is the
source of truth (no per-family string formatting), in a sandboxed Jinja environment with
`trim_blocks` and `lstrip_blocks`, the `loopcontrols` extension, a `tojson` that does not
escape HTML, `raise_exception` and `strftime_now`, and the tokenizer's named special tokens
(`bos_token`, `eos_token`, ...) as variables. Message keys whose value is None are dropped,
as transformers does, and a message's reasoning is offered under both names templates read
(`reasoning_content`, `thinking`). Templates come from checkpoint files, i.e. from strangers: the sandbox
is immutable, so a template cannot reach Python internals or mutate its inputs.

Where the template lives (transformers 5's order): `chat_template.jinja` beside the tokenizer
files, else `chat_template` in `tokenizer_config.json` (a string, or a list of named templates
of which `default` is used).
"""
from __future__ import annotations

import datetime
import functools
import json
from typing import Any, Mapping, Sequence

from jaxpod.runtime import storage

TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_CONFIG = "tokenizer_config.json"
# The named special tokens transformers hands every template (its SPECIAL_TOKENS_ATTRIBUTES).
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")

# Names a message's reasoning goes by; transformers copies it to the first two for templates.
_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")

Message = Mapping[str, Any]


class ChatTemplateError(ValueError):
  """A template that cannot be found, parsed or rendered for these messages; the message is one line."""


def _read_tokenizer_config(folder: str) -> dict:
  url = storage.join(folder, TOKENIZER_CONFIG)
  if not storage.exists(url):
    return {}
  try:
    return json.loads(storage.read_text(url))
  except json.JSONDecodeError as e:
    raise ChatTemplateError(f"{url}: not valid JSON ({e}); fix or remove the file") from None


def load_chat_template(folder: str) -> str | None:
  """The chat template text in a tokenizer folder (local path or URL), or None if it has none."""
  jinja_url = storage.join(folder, TEMPLATE_FILE)
  if storage.exists(jinja_url):
    return storage.read_text(jinja_url)
  template = _read_tokenizer_config(folder).get("chat_template")
  if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}, ...]
    named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
    if "default" not in named:
      raise ChatTemplateError(f"{storage.join(folder, TOKENIZER_CONFIG)}: chat_template lists {sorted(named)} "
                              "but no 'default'; name one 'default'")
    template = named["default"]
  if template is not None and not isinstance(template, str):
    raise ChatTemplateError(f"{storage.join(folder, TOKENIZER_CONFIG)}: chat_template is a "
                            f"{type(template).__name__}, expected a string")
  return template


def load_special_tokens(folder: str) -> dict[str, str]:
  """The named special tokens (`bos_token`, ...) of a tokenizer folder, as the strings templates see."""
  cfg = _read_tokenizer_config(folder)
  tokens = {}
  for name in SPECIAL_TOKEN_NAMES:
    value = cfg.get(name)
    if isinstance(value, Mapping):  # a serialised AddedToken
      value = value.get("content")
    if isinstance(value, str):
      tokens[name] = value
  return tokens


@functools.lru_cache(maxsize=16)
def _compile(template: str):
  import jinja2
  import jinja2.ext
  from jinja2.sandbox import ImmutableSandboxedEnvironment

  def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)

  def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

  def strftime_now(fmt):
    return datetime.datetime.now().strftime(fmt)

  env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                      extensions=[jinja2.ext.loopcontrols])
  env.filters["tojson"] = tojson
  env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now)
  try:
    return env.from_string(template)
  except jinja2.exceptions.TemplateSyntaxError as e:
    raise ChatTemplateError(f"chat template does not parse (line {e.lineno}: {e.message})") from None


def _plain(messages: Sequence[Message], where: str) -> list[dict]:
  if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
    raise ChatTemplateError(f"{where}: expected a list of messages, got {type(messages).__name__}")
  out = []
  for i, m in enumerate(messages):
    if not isinstance(m, Mapping) or "role" not in m:
      raise ChatTemplateError(f"{where}: message {i} is not a dict with a 'role' ({m!r:.80})")
    m = {k: v for k, v in m.items() if v is not None}
    reasoning = next((m[k] for k in _REASONING_KEYS if k in m), None)
    if reasoning is not None:  # templates read `reasoning_content` (gpt-oss ones `thinking`)
      m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
    out.append(m)
  return out


def render_chat(template: str, messages: Sequence[Message], *, add_generation_prompt: bool,
                special_tokens: Mapping[str, str] | None = None, where: str = "messages",
                **variables: Any) -> str:
  """Render `messages` with `template` as transformers' `apply_chat_template(tokenize=False)` does.

  `where` names the input in errors (e.g. "prompts.jsonl:7"); `variables` reach the template
  as they do through apply_chat_template's kwargs (e.g. `enable_thinking=False`).
  """
  import jinja2

  compiled = _compile(template)
  context = {**(special_tokens or {}), **variables}
  try:
    return compiled.render(messages=_plain(messages, where), tools=context.pop("tools", None),
                           documents=context.pop("documents", None),
                           add_generation_prompt=add_generation_prompt, **context)
  except jinja2.exceptions.TemplateError as e:
    raise ChatTemplateError(f"{where}: the chat template refused these messages: {e}") from None


def split_prompt_answer(template: str, prompt: Sequence[Message], answer: Sequence[Message], *,
                        special_tokens: Mapping[str, str] | None = None, where: str = "messages",
                        **variables: Any) -> tuple[str, str]:
  """(rendered prompt with the generation prompt, the text that follows it in the rendered conversation).

  The answer is what the full conversation renders after the prompt; a template that renders
  the prompt differently once an answer follows (Qwen3's thinking tags, say) would give a wrong
  answer mask, so that is an error naming `where`, not a guess.
  """
  prompt_text = render_chat(template, prompt, add_generation_prompt=True, special_tokens=special_tokens,
                            where=where, **variables)
  full_text = render_chat(template, list(prompt) + list(answer), add_generation_prompt=False,
                          special_tokens=special_tokens, where=where, **variables)
  if not full_text.startswith(prompt_text):
    raise ChatTemplateError(
        f"{where}: the chat template renders the prompt differently when an answer follows it, so the "
        "answer tokens cannot be told apart; give the prompt as text, or a template without that branch")
  return prompt_text, full_text[len(prompt_text):]
