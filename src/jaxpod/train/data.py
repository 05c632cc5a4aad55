"""The trainer's glue to `jaxpod.data.sudoku`: dataset folder, per-host loader, metadata checks.

Everything substantive lives in the data package: `ensure_dataset` builds a dataset into its
cache (held-out test puzzles are never augmentations of training puzzles), `SudokuLoader`
gives this host's rows of every global batch (the same global batches for any host count),
with a grain train iterator whose `get_state()` the checkpoint stores, and an eval iterator
over the whole test split with a padded last batch (labels IGNORE, so metrics skip it).
"""
from __future__ import annotations

from jaxpod.train.config import DataConfig


def sudoku_config(cfg: DataConfig):
  """The data package's build config for a generated dataset."""
  from jaxpod.data.sudoku import SudokuDataConfig
  return SudokuDataConfig(box=cfg.box, train=cfg.num_train, test=cfg.num_test, aug=cfg.augmentations, seed=cfg.seed,
                          clues=cfg.clues)


def cache_root(cfg: DataConfig, runs_dir: str) -> str:
  """Where generated datasets live: data.cache_dir, $JAXPOD_DATA_CACHE, else `jaxpod_data` beside the runs
  folder, so that with a bucket runs folder the leader builds once into the bucket and every host reads it."""
  import os
  from jaxpod.runtime import storage
  root = cfg.cache_dir or os.environ.get("JAXPOD_DATA_CACHE")
  if root:
    return storage.absolute(root)
  return storage.join(storage.parent(runs_dir), "jaxpod_data")


def ensure_dataset(cfg: DataConfig, runs_dir: str) -> str:
  """The dataset folder (`data.path`, or generated into the cache if missing). Run on the leader."""
  from jaxpod.runtime import storage
  if cfg.path:
    if not storage.exists(storage.join(cfg.path, "train", "dataset.json")):
      raise FileNotFoundError(f"data.path={cfg.path}: no train/dataset.json there; point it at a dataset folder")
    return storage.absolute(cfg.path)
  from jaxpod.data.sudoku import ensure_dataset as build
  return build(sudoku_config(cfg), cache_root(cfg, runs_dir))


def make_loader(cfg: DataConfig, path: str, host_index: int, host_count: int):
  """This host's `SudokuLoader` (train_iter / eval_iter / metadata)."""
  from jaxpod.data.sudoku import SudokuLoader
  return SudokuLoader(path, cfg.global_batch_size, seed=cfg.seed, shard_index=host_index, shard_count=host_count,
                      eval_batch_size=cfg.eval_batch_size)
