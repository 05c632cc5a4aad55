"""Grain loader for puzzle datasets in the reference layout: deterministic, sharded, resumable.

Every global batch is a pure function of (seed, batch index): all hosts agree on it without
talking, and host h takes rows [h*B/H, (h+1)*B/H) of it, so a run on 1 host and on H hosts
with the same global batch sees the same global batches. Grain drives the iteration
(`MapDataset.range(...).map(...)`), so an iterator's state is `{"next_index": k}` and
`set_state` continues exactly where `get_state` was taken.

Train (as the reference): an epoch visits every group once in a seeded random order, drawing
one random puzzle (augmentation) per group. Epochs follow each other as one stream and batch
`step` is positions [step*B, (step+1)*B) of it, so nothing is dropped and a batch may straddle
two epochs (the reference's `epochs_per_iter` concatenation: 50,000 epochs of 1000 groups at
batch 768 = 65,104 steps). The train iterator's `next_index` is the global step, so resuming
at step k is `set_state({"next_index": k})`.

Eval: the whole test split in order; the last batch is padded with rows whose inputs are the
pad id (0), labels IGNORE (-100), puzzle identifier the blank one (0), and `mask` False.

Batch (per host, numpy): inputs int32 [b, seq_len], labels int32 [b, seq_len] (IGNORE where
no loss), puzzle_identifiers int32 [b], mask bool [b] (True = real example); b = global/hosts.
"""
from __future__ import annotations

import grain
import numpy as np

from jaxpod.data.sudoku import fmt

KEYS = ("inputs", "labels", "puzzle_identifiers", "mask")


def validate_batch(global_batch_size: int, hosts: int, data_parallel: int) -> int:
  """Check the global batch against hosts and data-parallel devices (before JAX init); returns the per-host batch."""
  if global_batch_size < 1:
    raise ValueError(f"global_batch_size must be >= 1, got {global_batch_size}")
  if hosts < 1 or data_parallel < 1:
    raise ValueError(f"hosts ({hosts}) and data_parallel devices ({data_parallel}) must be >= 1")
  if data_parallel % hosts:
    raise ValueError(f"data-parallel devices ({data_parallel}) must be a multiple of hosts ({hosts}) so each host "
                     "feeds its own rows; change the mesh's data/fsdp sizes")
  if global_batch_size % data_parallel:
    up = -(-global_batch_size // data_parallel) * data_parallel
    raise ValueError(f"global_batch_size {global_batch_size} is not divisible by {data_parallel} data-parallel devices "
                     f"({hosts} hosts); use a multiple of {data_parallel}, e.g. {up}")
  return global_batch_size // hosts


def _shard(shard_index: int | None, shard_count: int | None) -> tuple[int, int]:
  if shard_index is None or shard_count is None:
    import jax  # only when the caller did not say which host this is
    shard_index = jax.process_index() if shard_index is None else shard_index
    shard_count = jax.process_count() if shard_count is None else shard_count
  if not 0 <= shard_index < shard_count:
    raise ValueError(f"shard_index must be in [0, {shard_count}), got {shard_index}")
  return shard_index, shard_count


class SudokuLoader:
  """Train and eval iterators over one dataset folder for this host's shard."""

  def __init__(self, path: str, global_batch_size: int, *, seed: int = 0, shard_index: int | None = None,
               shard_count: int | None = None, eval_batch_size: int | None = None, prefetch: int = 2):
    self.path = path
    self.seed = seed
    self.shard_index, self.shard_count = _shard(shard_index, shard_count)
    self.global_batch_size = global_batch_size
    self.eval_batch_size = eval_batch_size or global_batch_size
    for name, b in (("global_batch_size", global_batch_size), ("eval_batch_size", self.eval_batch_size)):
      if b < 1 or b % self.shard_count:
        raise ValueError(f"{name} {b} must be a positive multiple of the {self.shard_count} hosts")
    self.train = fmt.read(path, "train")
    self.test = fmt.read(path, "test")
    if self.train.num_groups < 1:
      raise ValueError(f"{path} has no training groups; rebuild it with --train >= 1")
    self.eval_steps = -(-len(self.test) // self.eval_batch_size)
    self.prefetch = prefetch
    self._orders: dict[int, np.ndarray] = {}

  @property
  def metadata(self) -> dict:
    """The train split's dataset.json (vocab_size, seq_len, ...)."""
    return self.train.metadata

  def _read_options(self) -> grain.ReadOptions:
    return grain.ReadOptions(num_threads=1 if self.prefetch else 0, prefetch_buffer_size=self.prefetch)

  def _group_order(self, epoch: int) -> np.ndarray:
    """The seeded group permutation of `epoch` (the latest one is cached)."""
    if epoch not in self._orders:
      if len(self._orders) >= 4:
        self._orders.pop(min(self._orders))
      self._orders[epoch] = np.random.default_rng((self.seed, epoch)).permutation(self.train.num_groups)
    return self._orders[epoch]

  @property
  def steps_per_epoch(self) -> float:
    """Train batches per epoch (groups / global batch; need not be whole)."""
    return self.train.num_groups / self.global_batch_size

  def steps_for_epochs(self, epochs: float) -> int:
    """Whole train batches in `epochs` epochs (the last partial batch is dropped)."""
    return int(epochs * self.train.num_groups // self.global_batch_size)

  def _rows(self, split: fmt.Split, examples: np.ndarray, puzzles: np.ndarray, valid: np.ndarray) -> dict:
    """Host-local batch from global example/puzzle indices (invalid rows padded)."""
    b = len(examples) // self.shard_count
    part = slice(self.shard_index * b, (self.shard_index + 1) * b)
    ex, pz, ok = examples[part], puzzles[part], valid[part]
    inputs = np.where(ok[:, None], split.inputs[ex], split.metadata["pad_id"]).astype(np.int32)
    labels = split.labels[ex].astype(np.int32)
    ignore = split.metadata.get("ignore_label_id")
    if ignore is not None:
      labels[labels == ignore] = fmt.IGNORE
    labels[~ok] = fmt.IGNORE
    ids = np.where(ok, split.puzzle_identifiers[pz], split.metadata["blank_identifier_id"]).astype(np.int32)
    return {"inputs": inputs, "labels": labels, "puzzle_identifiers": ids, "mask": ok}

  def train_batch(self, step: int) -> dict:
    """The host-local part of global train batch `step` (pure function of seed and step)."""
    gb, s = self.global_batch_size, self.train
    epoch, pos = np.divmod(step * gb + np.arange(gb), s.num_groups)
    groups = np.empty(gb, np.int64)
    for e in np.unique(epoch):
      groups[epoch == e] = self._group_order(int(e))[pos[epoch == e]]
    u = np.random.default_rng((self.seed, step, 1)).random((2, gb))
    lo, hi = s.group_indices[groups], s.group_indices[groups + 1]
    puzzles = lo + (u[0] * (hi - lo)).astype(np.int64)
    first, last = s.puzzle_indices[puzzles], s.puzzle_indices[puzzles + 1]
    examples = first + (u[1] * (last - first)).astype(np.int64)
    return self._rows(s, examples, puzzles, np.ones(gb, bool))

  def eval_batch(self, step: int) -> dict:
    """The host-local part of eval batch `step`: test examples in order, padded at the end."""
    gb, s = self.eval_batch_size, self.test
    rows = np.arange(step * gb, (step + 1) * gb)
    valid = rows < len(s)
    examples = np.minimum(rows, max(len(s) - 1, 0))
    puzzles = np.searchsorted(s.puzzle_indices, examples, side="right") - 1
    return self._rows(s, examples, np.clip(puzzles, 0, None), valid)

  def train_iter(self, num_steps: int | None = None) -> grain.DatasetIterator:
    """Checkpointable iterator over train batches 0..num_steps-1 (None: forever); see `steps_for_epochs`."""
    ds = grain.MapDataset.range(1).repeat(None) if num_steps is None else grain.MapDataset.range(num_steps)
    ds = ds.map_with_index(lambda step, _: self.train_batch(step))
    return iter(ds.to_iter_dataset(self._read_options()))

  def eval_iter(self) -> grain.DatasetIterator:
    """Iterator over the whole test split in order (`eval_steps` batches, last one padded)."""
    ds = grain.MapDataset.range(self.eval_steps).map(self.eval_batch)
    return iter(ds.to_iter_dataset(self._read_options()))


def make_global_batch(batch: dict, sharding) -> dict:
  """Assemble each host's rows into global jax.Arrays sharded by `sharding` (leading axis = batch)."""
  import jax

  return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()}
