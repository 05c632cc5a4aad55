"""Tokenizers for Llama checkpoints, offline: `tokenizer.json` via `tokenizers`, else bytes.

`load_tokenizer(folder)` returns a `Tokenizer`:
  - `tokenizer.json` present -> the `tokenizers` library (no network, no transformers import);
  - other HF tokenizer files only (e.g. sentencepiece) -> transformers' AutoTokenizer with
    `local_files_only=True`, if transformers is installed;
  - no tokenizer files at all -> `ByteTokenizer` (ids 0..255 are bytes, then BOS, EOS, PAD).
A tokenizer file that exists but cannot be read raises: silently falling back would
produce garbage text.
"""
from __future__ import annotations

import json
import os
import tempfile
from typing import Protocol, Sequence

import fsspec

from jaxpod.runtime.extras import install_hint

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json")


class Tokenizer(Protocol):
  """What jaxpod needs of a tokenizer."""

  bos_id: int | None
  eos_ids: tuple[int, ...]
  pad_id: int

  def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
    """Ids of text; add_special_tokens=False: no BOS added (a rendered chat template carries its own)."""

  def decode(self, ids: Sequence[int]) -> str: ...


class ByteTokenizer:
  """UTF-8 bytes as ids 0..255; BOS=256, EOS=257, PAD=258 (needs vocab >= 259)."""

  vocab_size = 259

  def __init__(self, add_bos: bool = True):
    self.bos_id, self.eos_ids, self.pad_id, self.add_bos = 256, (257,), 258, add_bos

  def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
    return ([self.bos_id] if self.add_bos and add_special_tokens else []) + list(text.encode("utf-8"))

  def decode(self, ids: Sequence[int]) -> str:
    return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


class HFTokenizer:
  """A `tokenizers.Tokenizer` plus the special ids from the checkpoint's config files."""

  def __init__(self, tok, bos_id: int | None, eos_ids: tuple[int, ...], pad_id: int | None):
    self.tok = tok
    self.bos_id, self.eos_ids = bos_id, eos_ids
    self.pad_id = pad_id if pad_id is not None else (eos_ids[0] if eos_ids else 0)

  def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
    return list(self.tok.encode(text, add_special_tokens=add_special_tokens).ids)

  def decode(self, ids: Sequence[int]) -> str:
    return self.tok.decode(list(ids), skip_special_tokens=True)


class _TransformersTokenizer(HFTokenizer):
  def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
    return list(self.tok(text, add_special_tokens=add_special_tokens)["input_ids"])


def _read_json(fs, path: str) -> dict:
  if not fs.exists(path):
    return {}
  with fs.open(path, "r") as f:
    return json.load(f)


def _special_ids(fs, root: str, tok_cfg: dict, token_to_id) -> tuple[int | None, tuple[int, ...], int | None]:
  model_cfg = _read_json(fs, f"{root}/config.json")
  gen_cfg = _read_json(fs, f"{root}/generation_config.json")

  def token_id(name):
    t = tok_cfg.get(name)
    t = t.get("content") if isinstance(t, dict) else t
    return token_to_id(t) if t else None

  bos = token_id("bos_token")
  bos = bos if bos is not None else model_cfg.get("bos_token_id")
  eos = gen_cfg.get("eos_token_id", model_cfg.get("eos_token_id"))
  eos = token_id("eos_token") if eos is None else eos
  eos = () if eos is None else tuple(eos) if isinstance(eos, list) else (int(eos),)
  pad = token_id("pad_token")
  return bos, eos, pad if pad is not None else model_cfg.get("pad_token_id")


def load_tokenizer(url: str) -> Tokenizer:
  """The checkpoint's tokenizer, offline; `ByteTokenizer` when the folder has none."""
  fs, root = fsspec.core.url_to_fs(url)
  root = root.rstrip("/")
  present = [n for n in TOKENIZER_FILES if fs.exists(f"{root}/{n}")]
  if not present:
    return ByteTokenizer()
  tok_cfg = _read_json(fs, f"{root}/tokenizer_config.json")
  if "tokenizer.json" in present:
    from tokenizers import Tokenizer as RawTokenizer
    with fs.open(f"{root}/tokenizer.json", "r") as f:
      text = f.read()
    try:
      tok = RawTokenizer.from_str(text)
    except Exception as e:
      raise ValueError(f"{url}/tokenizer.json cannot be read ({type(e).__name__}: {e}); fix or remove it "
                       "(without tokenizer files jaxpod uses a byte-level tokenizer)") from e
    return HFTokenizer(tok, *_special_ids(fs, root, tok_cfg, tok.token_to_id))
  try:
    from transformers import AutoTokenizer
  except ImportError as e:
    raise ValueError(f"{url} has tokenizer files {present} but no tokenizer.json; reading them needs transformers: "
                     f"{install_hint('transformers')}") from e
  with tempfile.TemporaryDirectory() as tmp:
    for n in present:
      fs.get(f"{root}/{n}", os.path.join(tmp, n))
    tok = AutoTokenizer.from_pretrained(tmp, local_files_only=True)
  return _TransformersTokenizer(tok, tok.bos_token_id, tuple([tok.eos_token_id] if tok.eos_token_id is not None
                                                             else []), tok.pad_token_id)


def tokenizer_from(spec: str) -> Tokenizer:
  """The tokenizer a task's spec names: 'byte' (ByteTokenizer) or a folder with tokenizer.json."""
  from jaxpod.runtime import storage
  if spec == "byte":
    return ByteTokenizer()
  if not storage.exists(spec):
    raise FileNotFoundError(f"task.data.tokenizer={spec!r}: no such folder; use 'byte' or a folder with "
                            "tokenizer.json")
  return load_tokenizer(spec)


def _byte_chars() -> list[str]:
  """Byte b -> the printable character byte-level BPE files spell it with (GPT-2's table)."""
  printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
  chars, extra = {}, 0
  for b in range(256):
    if b in printable:
      chars[b] = chr(b)
    else:
      chars[b] = chr(256 + extra)
      extra += 1
  return [chars[b] for b in range(256)]


def save_byte_tokenizer(url: str, tokenizer: ByteTokenizer | None = None) -> None:
  """Write HF tokenizer files (`tokenizer.json`, `tokenizer_config.json`) that encode as `ByteTokenizer` does.

  A checkpoint trained with jaxpod's byte-level tokenizer then loads in any HF tool
  (`AutoTokenizer`, TRL) with the same ids: byte b is id b, then BOS, EOS, PAD, BOS prepended.
  """
  from tokenizers import Tokenizer as RawTokenizer, decoders, models, pre_tokenizers, processors

  from jaxpod.runtime import storage

  byte_tok = tokenizer or ByteTokenizer()
  tok = RawTokenizer(models.BPE(vocab={c: i for i, c in enumerate(_byte_chars())}, merges=[]))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
  tok.decoder = decoders.ByteLevel()
  # Like every HF tokenizer, these strings inside a text become the special ids; hence unusual names.
  bos, eos, pad = "<|bos|>", "<|eos|>", "<|pad|>"
  tok.add_special_tokens([bos, eos, pad])  # ids 256, 257, 258 (ByteTokenizer's): after the 256 bytes
  if byte_tok.add_bos:
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, byte_tok.bos_id)])
  config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos, "pad_token": pad,
            "model_max_length": 1 << 30, "clean_up_tokenization_spaces": False}
  storage.makedirs(url)
  storage.write_text(storage.join(url, "tokenizer.json"), tok.to_str())
  storage.write_text(storage.join(url, "tokenizer_config.json"), json.dumps(config, indent=2))
