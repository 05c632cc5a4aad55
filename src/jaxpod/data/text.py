"""Text for causal-LM training: a deterministic built-in corpus, token packing, per-host batches.

    text = grammar_text(seed=0, num_chars=300_000)   # the same string on every machine, no network
    train_bpe_tokenizer(text, 512, "tok/")           # optional: a BPE trained offline (lm.tokenizer: tok/)
    writer = RowWriter(url)                          # leader (jaxpod.io.rows): rows of 128 tokens, in chunks
    for rows in packed_rows(token_batches(lines, tokenizer, eos_id), seq_len=128):
      writer.append(tokens=rows)                     # [K, 128] int32 per batch of documents
    sha256 = writer.close()
    loader = TextLoader(RowStore(url, sha256), seq_len=128, global_batch_size=32, eval_batch_size=32,
                        shard_index=host, shard_count=hosts, pad_id=258)   # every host: reads only its rows
    it = loader.train_iter(); batch = next(it)       # {"tokens", "mask"}: [per_host, seq_len] each
    it.get_state() / it.set_state(state)             # {"step": n}: the checkpoint stores it

Documents (lines) are tokenized in batches (the tokenizers library's `encode_batch`) into numpy arrays
and concatenated into one stream, cut into fixed-length rows; a held-out tail of rows is the eval
split. `rows` is a row source (`jaxpod.io.rows`: a RowStore in shared storage, read by byte range) or,
in one process, the token stream itself. Train batch k is a slice of an epoch-wise permutation drawn
from (seed, epoch), so it depends only on k: any host count sees the same global batches, each host
reads only its rows of them, and resuming needs only the step.
"""
from __future__ import annotations

import random
from typing import Callable, Iterable, Iterator

import numpy as np

from jaxpod.io.rows import ArrayRows

_NAMES = ("the old king", "the young queen", "a tired farmer", "the small girl", "a quiet monk", "the brave knight",
          "an old sailor", "the clever fox", "a grey wolf", "the little boy", "a kind baker", "the wise woman")
_VERBS = ("walked to", "looked at", "ran past", "sang near", "waited by", "slept under", "painted", "remembered",
          "found", "carried water to", "built a fire near", "told a story about")
_PLACES = ("the river", "the tall tower", "the green hill", "the dark forest", "the village well", "the old bridge",
           "the stone wall", "the market", "the cold sea", "the garden", "the mill", "the castle gate")
_TIMES = ("at dawn", "in the evening", "after the rain", "before the winter", "at noon", "under the moon",
          "on a windy day", "in the spring")
_FEELINGS = ("was happy", "felt calm", "was very hungry", "felt afraid", "smiled", "laughed softly", "was tired",
             "felt brave")


def _cap(s: str) -> str:
  return s[0].upper() + s[1:]


def _sentence(r: random.Random) -> str:
  who = r.choice(_NAMES)
  form = r.randrange(4)
  if form == 0:
    return f"{_cap(who)} {r.choice(_VERBS)} {r.choice(_PLACES)} {r.choice(_TIMES)}."
  if form == 1:
    return f"{_cap(r.choice(_TIMES))}, {who} {r.choice(_VERBS)} {r.choice(_PLACES)}."
  if form == 2:
    return f"{_cap(who)} {r.choice(_FEELINGS)}, because {r.choice(_NAMES)} {r.choice(_VERBS)} {r.choice(_PLACES)}."
  return f"{_cap(who)} {r.choice(_VERBS)} {r.choice(_PLACES)} and {r.choice(_FEELINGS)}."


def grammar_text(seed: int = 0, num_chars: int = 300_000) -> str:
  """Short paragraphs (one per line) from a fixed toy grammar; identical for the same (seed, num_chars)."""
  r = random.Random(seed)
  lines, total = [], 0
  while total < num_chars:
    line = " ".join(_sentence(r) for _ in range(r.randint(2, 4)))
    lines.append(line)
    total += len(line) + 1
  return "\n".join(lines) + "\n"


def batch_encoder(tokenizer) -> Callable[[list[str]], list[np.ndarray]]:
  """lines -> each line's ids (int32 arrays, BOS as the tokenizer adds it): the tokenizers library's
  `encode_batch` when the tokenizer wraps one, UTF-8 bytes for the byte tokenizer, else `encode` per line."""
  from jaxpod.models.llama.tokenizer import ByteTokenizer
  raw = getattr(tokenizer, "tok", None)
  if callable(getattr(raw, "encode_batch", None)):
    return lambda lines: [np.asarray(e.ids, np.int32) for e in raw.encode_batch(lines)]
  if isinstance(tokenizer, ByteTokenizer):
    bos = np.asarray([tokenizer.bos_id] if tokenizer.add_bos else [], np.int32)
    return lambda lines: [np.concatenate([bos, np.frombuffer(l.encode("utf-8"), np.uint8)]) for l in lines]
  encode = tokenizer.encode if hasattr(tokenizer, "encode") else tokenizer
  return lambda lines: [np.asarray(encode(l), np.int32) for l in lines]


def token_batches(lines: Iterable[str], tokenizer, eos_id: int | None, batch_lines: int = 4096) -> Iterator[np.ndarray]:
  """Int32 token streams, one per batch of `batch_lines` lines: each non-empty line encoded, then EOS."""
  encode, eos = batch_encoder(tokenizer), np.asarray([] if eos_id is None else [eos_id], np.int32)
  batch: list[str] = []
  for line in lines:
    if line.strip():
      batch.append(line)
    if len(batch) == batch_lines:
      yield np.concatenate([p for ids in encode(batch) for p in (ids, eos)])
      batch = []
  if batch:
    yield np.concatenate([p for ids in encode(batch) for p in (ids, eos)])


def tokenize_documents(text: str, tokenizer, eos_id: int | None) -> np.ndarray:
  """One int32 stream: each non-empty line encoded (the tokenizer adds BOS if it does), then EOS."""
  parts = list(token_batches(text.splitlines(), tokenizer, eos_id))
  return np.concatenate(parts) if parts else np.zeros(0, np.int32)


def packed_rows(batches: Iterable[np.ndarray], seq_len: int) -> Iterator[np.ndarray]:
  """Token streams -> [K, seq_len] rows of their concatenation (the tail shorter than a row is dropped)."""
  carry = np.zeros(0, np.int32)
  for tokens in batches:
    carry = np.concatenate([carry, tokens])
    k = len(carry) // seq_len
    if k:
      yield carry[:k * seq_len].reshape(k, seq_len)
      carry = carry[k * seq_len:]


def train_bpe_tokenizer(text: str, vocab_size: int, folder: str) -> str:
  """Train a byte-level BPE on `text` offline (`tokenizers`) and save it as `folder`/tokenizer.json.

  Ids 0, 1, 2 are <pad>, <s> (BOS, prepended by the post-processor) and </s> (EOS);
  tokenizer_config.json names them, so `jaxpod.models.llama.load_tokenizer(folder)` reads them.
  """
  import json
  from pathlib import Path
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<s>", "</s>"],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
  tok.train_from_iterator(text.splitlines(), trainer)
  tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
  Path(folder).mkdir(parents=True, exist_ok=True)
  tok.save(str(Path(folder) / "tokenizer.json"))
  config = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}
  (Path(folder) / "tokenizer_config.json").write_text(json.dumps(config))
  return folder


class StepIterator:
  """Checkpointable train iterator over any loader with `train_batch(step)`: its state is the batches drawn."""

  def __init__(self, loader):
    self.loader, self.step = loader, 0

  def __iter__(self) -> Iterator[dict]:
    return self

  def __next__(self) -> dict:
    batch = self.loader.train_batch(self.step)
    self.step += 1
    return batch

  def get_state(self) -> dict:
    return {"step": self.step}

  def set_state(self, state: dict) -> None:
    self.step = int(state["step"])


class TextLoader:
  """This host's rows of every global batch over a packed token stream (read from `rows` as needed)."""

  def __init__(self, rows, seq_len: int, global_batch_size: int, eval_batch_size: int, *,
               eval_fraction: float = 0.05, seed: int = 0, shard_index: int = 0, shard_count: int = 1,
               pad_id: int = 0):
    if isinstance(rows, np.ndarray):  # one process: the whole token stream, packed here
      rows = ArrayRows({"tokens": np.asarray(rows[:len(rows) // seq_len * seq_len], np.int32).reshape(-1, seq_len)})
    total = rows.num_rows
    num_eval = max(1, int(round(total * eval_fraction)))
    if total - num_eval < global_batch_size:
      raise ValueError(f"the text gives {total} rows of {seq_len} tokens ({num_eval} held out): fewer than "
                       f"data.global_batch_size={global_batch_size}; use a longer text or lower the batch")
    self.rows = rows
    self.train_rows, self.eval_rows = range(total - num_eval), range(total - num_eval, total)
    self.seq_len, self.gb, self.eb, self.seed, self.pad_id = seq_len, global_batch_size, eval_batch_size, seed, pad_id
    self.index, self.count = shard_index, shard_count
    self.steps_per_epoch = len(self.train_rows) // global_batch_size
    self._perm: tuple[int, np.ndarray] | None = None

  @property
  def metadata(self) -> dict:
    return {"train_rows": len(self.train_rows), "eval_rows": len(self.eval_rows), "seq_len": self.seq_len}

  def _host_slice(self, rows: np.ndarray, batch: int) -> np.ndarray:
    per = batch // self.count
    return rows[self.index * per:(self.index + 1) * per]

  def _read(self, ids: np.ndarray) -> np.ndarray:
    return np.asarray(self.rows.read(ids)["tokens"], np.int32)

  def train_batch(self, step: int) -> dict:
    """Global batch `step` (this host's rows): a slice of epoch step // steps_per_epoch's permutation."""
    epoch, j = divmod(step, self.steps_per_epoch)
    if self._perm is None or self._perm[0] != epoch:
      self._perm = (epoch, np.random.default_rng([self.seed, epoch]).permutation(len(self.train_rows)))
    ids = self._perm[1][j * self.gb:(j + 1) * self.gb]
    tokens = self._read(self._host_slice(ids, self.gb))
    return {"tokens": tokens, "mask": np.ones(tokens.shape, bool)}

  def train_iter(self) -> StepIterator:
    return StepIterator(self)

  def eval_iter(self) -> Iterator[dict]:
    """The whole held-out split in order (this host's rows of each batch); the last batch padded with masked rows."""
    per = self.eb // self.count
    for start in range(self.eval_rows.start, self.eval_rows.stop, self.eb):
      mine = np.arange(start + self.index * per, start + (self.index + 1) * per)
      real = mine[mine < self.eval_rows.stop]
      tokens = np.full((per, self.seq_len), self.pad_id, np.int32)
      tokens[:len(real)] = self._read(real)
      mask = np.zeros((per, self.seq_len), bool)
      mask[:len(real)] = True
      yield {"tokens": tokens, "mask": mask}
