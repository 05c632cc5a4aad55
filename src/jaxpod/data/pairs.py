"""Preference pairs as arrays, and this host's share of every batch of them.

    row = encode_pair(prompt_ids, chosen_ids, rejected_ids, max_length=64, pad_id=0)
    # row["tokens"]: [2, L] (chosen, rejected: prompt + answer, padded); row["answer"]: [2, L] 1 on answer tokens
    loader = PairLoader({"tokens": [N, 2, L], "answer": [N, 2, L]}, global_batch_size=32, eval_size=64,
                        seed=0, shard_index=host, shard_count=hosts)
    it = loader.train_iter(); batch = next(it)       # this host's [B / hosts, 2, L] rows of global batch k
    it.get_state() / it.set_state(state)             # {"step": n}: the checkpoint stores it

The two answers of a pair sit side by side in one row, so they are always on the same host and go
through the model in one forward. Train batch k is a slice of an epoch-wise permutation drawn from
(seed, epoch): it depends only on k, so any host count sees the same global batches and resuming
needs only the step. The last `eval_size` pairs are held out.
"""
from __future__ import annotations

import hashlib
import io
from typing import Iterator, Sequence

import numpy as np

from jaxpod.data.text import StepIterator
from jaxpod.runtime import storage


def encode_pair(prompt: Sequence[int], chosen: Sequence[int], rejected: Sequence[int], max_length: int,
                pad_id: int) -> dict[str, np.ndarray]:
  """tokens [2, max_length] (prompt + answer, padded) and answer [2, max_length] (1 on the answer's tokens)."""
  tokens = np.full((2, max_length), pad_id, np.int32)
  answer = np.zeros((2, max_length), np.int8)
  for side, ids in enumerate((chosen, rejected)):
    row = list(prompt) + list(ids)
    if len(row) > max_length:
      raise ValueError(f"a pair needs {len(row)} tokens but max_length={max_length}")
    tokens[side, :len(row)] = row
    answer[side, len(prompt):len(row)] = 1
  return {"tokens": tokens, "answer": answer}


def stack_pairs(rows: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
  """[{name: [2, L]}] -> {name: [N, 2, L]}."""
  return {k: np.stack([r[k] for r in rows]) for k in rows[0]}


def write_pairs(url: str, arrays: dict[str, np.ndarray]) -> str:
  """Store pair arrays as one .npz at `url` (shared storage, atomic); its sha256, for hosts to check."""
  buf = io.BytesIO()
  np.savez(buf, **arrays)
  storage.write_bytes(url, buf.getvalue())
  return hashlib.sha256(buf.getvalue()).hexdigest()


def read_pairs(url: str, sha256: str | None = None) -> dict[str, np.ndarray]:
  """The arrays `write_pairs` stored; ValueError if the file's sha256 is not the one given."""
  blob = storage.read_bytes(url)
  if sha256 is not None and hashlib.sha256(blob).hexdigest() != sha256:
    raise ValueError(f"{url} changed since the leader wrote it (sha256 differs); is another run writing the same "
                     "data cache? rerun, or set task.data.cache_dir to a folder of this run's own")
  with np.load(io.BytesIO(blob), allow_pickle=False) as z:
    return {k: z[k] for k in z.files}


class PairLoader:
  """This host's pairs of every global batch; the last `eval_size` pairs held out."""

  def __init__(self, arrays: dict[str, np.ndarray], global_batch_size: int, eval_size: int, *, seed: int = 0,
               shard_index: int = 0, shard_count: int = 1):
    total = len(arrays["tokens"])
    if total - eval_size < global_batch_size:
      raise ValueError(f"{total} pairs ({eval_size} held out) are fewer than task.data.global_batch_size="
                       f"{global_batch_size}; bring more pairs or lower the batch")
    self.train = {k: v[:total - eval_size] for k, v in arrays.items()}
    self.eval = {k: v[total - eval_size:] for k, v in arrays.items()}
    self.gb, self.seed, self.index, self.count = global_batch_size, seed, shard_index, shard_count
    self.steps_per_epoch = (total - eval_size) // global_batch_size
    self._perm: tuple[int, np.ndarray] | None = None

  def _mine(self, rows: dict[str, np.ndarray], batch: int) -> dict[str, np.ndarray]:
    per = batch // self.count
    return {k: v[self.index * per:(self.index + 1) * per] for k, v in rows.items()}

  def train_batch(self, step: int) -> dict[str, np.ndarray]:
    """This host's share of global batch `step`."""
    epoch, j = divmod(step, self.steps_per_epoch)
    if self._perm is None or self._perm[0] != epoch:
      self._perm = (epoch, np.random.default_rng([self.seed, epoch]).permutation(len(self.train["tokens"])))
    ids = np.sort(self._mine({"i": self._perm[1][j * self.gb:(j + 1) * self.gb]}, self.gb)["i"])
    return {k: v[ids] for k, v in self.train.items()}

  def train_iter(self) -> StepIterator:
    return StepIterator(self)

  def eval_iter(self, batch: int) -> Iterator[dict[str, np.ndarray]]:
    """The held-out pairs in order, `batch` per step, the last batch padded with rows whose `valid` is 0."""
    n = len(self.eval["tokens"])
    for start in range(0, n, batch):
      rows = {k: v[start:start + batch] for k, v in self.eval.items()}
      fill = batch - len(rows["tokens"])
      rows = {k: np.concatenate([v, np.zeros((fill, *v.shape[1:]), v.dtype)]) for k, v in rows.items()}
      rows["valid"] = (np.arange(batch) < batch - fill).astype(np.int32)
      yield self._mine(rows, batch)
