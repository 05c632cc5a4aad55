"""Where tasks put prepared data (datasets, token files): one cache root in shared storage."""
from __future__ import annotations

from jaxpod.train.config import DataConfig


def cache_root(cfg: DataConfig, runs_dir: str) -> str:
  """Where prepared data lives: data.cache_dir, $JAXPOD_DATA_CACHE, else `jaxpod_data` beside the runs
  folder, so that with a bucket runs folder the leader builds once into the bucket and every host reads it."""
  import os
  from jaxpod.runtime import storage
  root = cfg.cache_dir or os.environ.get("JAXPOD_DATA_CACHE")
  if root:
    return storage.absolute(root)
  return storage.join(storage.parent(runs_dir), "jaxpod_data")
