"""Preference pairs as arrays, and this host's share of every batch of them.

    row = encode_pair(prompt_ids, chosen_ids, rejected_ids, max_length=64, pad_id=0)
    # row["tokens"]: [2, L] (chosen, rejected: prompt + answer, padded); row["answer"]: [2, L] 1 on answer tokens
    sha256 = write_pairs(url, {"tokens": [N, 2, L], "answer": [N, 2, L]})   # leader: a row store in shared storage
    loader = PairLoader(open_pairs(url, sha256), global_batch_size=32, eval_size=64,   # every host
                        seed=0, shard_index=host, shard_count=hosts)
    it = loader.train_iter(); batch = next(it)       # this host's [B / hosts, 2, L] rows of global batch k
    it.get_state() / it.set_state(state)             # {"step": n}: the checkpoint stores it

The two answers of a pair sit side by side in one row, so they are always on the same host and go
through the model in one forward. Train batch k is a slice of an epoch-wise permutation drawn from
(seed, epoch): it depends only on k, so any host count sees the same global batches, each host reads
only its rows of them (by byte range, checked by chunk: `jaxpod.io.rows`) and resuming needs only the
step. The last `eval_size` pairs are held out.
"""
from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from jaxpod.data.text import StepIterator
from jaxpod.io.rows import ArrayRows, RowStore, write_rows


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


def write_pairs(url: str, arrays: dict[str, np.ndarray], chunk_rows: int = 0) -> str:
  """Leader: store pair arrays [N, ...] as a row store at `url` (shared storage); its manifest's sha256."""
  return write_rows(url, arrays, chunk_rows)


def open_pairs(url: str, sha256: str | None = None) -> RowStore:
  """Every host: the pairs `write_pairs` stored, read by row (ValueError if the manifest's sha256 differs)."""
  return RowStore(url, sha256)


class PairLoader:
  """This host's pairs of every global batch (read from `rows` as needed); the last `eval_size` pairs held out."""

  def __init__(self, rows, global_batch_size: int, eval_size: int, *, seed: int = 0, shard_index: int = 0,
               shard_count: int = 1):
    rows = ArrayRows(rows) if isinstance(rows, dict) else rows
    total = rows.num_rows
    if total - eval_size < global_batch_size:
      raise ValueError(f"{total} pairs ({eval_size} held out) are fewer than task.data.global_batch_size="
                       f"{global_batch_size}; bring more pairs or lower the batch")
    self.rows, self.num_train, self.eval_rows = rows, total - eval_size, range(total - eval_size, total)
    self.gb, self.seed, self.index, self.count = global_batch_size, seed, shard_index, shard_count
    self.steps_per_epoch = self.num_train // global_batch_size
    self._perm: tuple[int, np.ndarray] | None = None

  def _mine(self, rows: np.ndarray, batch: int) -> np.ndarray:
    per = batch // self.count
    return rows[self.index * per:(self.index + 1) * per]

  def train_batch(self, step: int) -> dict[str, np.ndarray]:
    """This host's share of global batch `step`."""
    epoch, j = divmod(step, self.steps_per_epoch)
    if self._perm is None or self._perm[0] != epoch:
      self._perm = (epoch, np.random.default_rng([self.seed, epoch]).permutation(self.num_train))
    return self.rows.read(np.sort(self._mine(self._perm[1][j * self.gb:(j + 1) * self.gb], self.gb)))

  def train_iter(self) -> StepIterator:
    return StepIterator(self)

  def eval_iter(self, batch: int) -> Iterator[dict[str, np.ndarray]]:
    """The held-out pairs in order, `batch` per step (this host's share), the last batch padded with rows whose
    `valid` is 0."""
    stop = self.eval_rows.stop
    for start in range(self.eval_rows.start, stop, batch):
      mine = self._mine(np.arange(start, start + batch), batch)
      real = mine[mine < stop]
      rows = self.rows.read(real)
      fill = len(mine) - len(real)
      rows = {k: np.concatenate([v, np.zeros((fill, *v.shape[1:]), v.dtype)]) for k, v in rows.items()}
      rows["valid"] = (mine < stop).astype(np.int32)
      yield rows
