"""Persistent XLA compile cache: on by default, shared across runs, safe with many hosts.

JAX lets only process 0 write entries; every process reads. On a real pod the folder must
therefore be shared storage (e.g. gs://...). On a multi-process CPU simulation the cache key
includes each process's device topology, so only process 0 gets hits there.
"""
from __future__ import annotations

import dataclasses
import os
import threading
import warnings
from pathlib import Path

from jaxpod.runtime.log import get_logger

log = get_logger("compile_cache")
DEFAULT_DIR_NAME = "jaxpod_compile_cache"


@dataclasses.dataclass(frozen=True)
class CompileCacheConfig:
  """Where and what the persistent compile cache stores."""

  enabled: bool = True  # turn the persistent cache on
  dir: str | None = None  # cache folder (local or gs://); None: a sibling of the runs folder
  min_compile_time_s: float = 1.0  # only programs that took at least this long to compile are stored
  min_entry_size_bytes: int = 0  # only entries at least this large are stored (-1: JAX default)

  def __post_init__(self):
    if self.min_compile_time_s < 0:
      raise ValueError(f"compile_cache.min_compile_time_s={self.min_compile_time_s} must be >= 0")


def default_dir(runs_dir: str | None) -> str:
  """The cache folder: `$JAXPOD_COMPILE_CACHE`, else a sibling of the runs folder, else ~/.cache."""
  env = os.environ.get("JAXPOD_COMPILE_CACHE")
  if env:
    return env
  if runs_dir:
    from jaxpod.runtime import storage
    return storage.join(storage.parent(runs_dir), DEFAULT_DIR_NAME)
  return str(Path.home() / ".cache" / "jaxpod" / "compile_cache")


class CacheStats:
  """Counts persistent-cache hits and misses through jax.monitoring events."""

  def __init__(self):
    self.hits = 0
    self.misses = 0
    self._lock = threading.Lock()

  def on_event(self, event: str, **_):
    with self._lock:
      if event.endswith("compilation_cache/cache_hits"):
        self.hits += 1
      elif event.endswith("compilation_cache/cache_misses"):
        self.misses += 1

  def summary(self) -> str:
    return f"compile cache: {self.hits} hits, {self.misses} misses"


STATS = CacheStats()
_listener_installed = False


def _writable(path: str) -> str | None:
  """None if the folder can be created and written, else the reason."""
  if "://" in path:  # remote storage: JAX checks it itself
    return None
  try:
    os.makedirs(path, exist_ok=True)
    probe = Path(path) / f".probe-{os.getpid()}"
    probe.write_bytes(b"")
    probe.unlink()
    return None
  except OSError as e:
    return f"{type(e).__name__}: {e.strerror or e}"


def setup(cfg: CompileCacheConfig, runs_dir: str | None, is_leader: bool) -> str | None:
  """Point JAX at the cache folder; returns the folder, or None when disabled or unusable.

  An unwritable folder gives one warning and the run continues without the cache.
  """
  global _listener_installed
  import jax
  if not _listener_installed:
    jax.monitoring.register_event_listener(STATS.on_event)
    _listener_installed = True
  if not cfg.enabled:
    return None
  path = cfg.dir or default_dir(runs_dir)
  problem = _writable(path) if is_leader else None
  if problem:
    warnings.warn(f"compile cache folder {path} is not writable ({problem}); continuing without the "
                  "persistent cache. Set runtime.compile_cache.dir to a writable folder to enable it.",
                  stacklevel=2)
    return None
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", cfg.min_compile_time_s)
  if cfg.min_entry_size_bytes >= 0:
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", cfg.min_entry_size_bytes)
  return path


def info(path: str) -> dict:
  """Entry count and total size of a cache folder (local or a bucket URL)."""
  from jaxpod.runtime import storage
  fs, root = storage.filesystem(path)
  if not fs.exists(root):
    return {"dir": path, "exists": False, "entries": 0, "bytes": 0}
  files = fs.find(root, detail=True)
  return {"dir": path, "exists": True, "entries": len(files), "bytes": sum(f["size"] for f in files.values())}


def clear(path: str) -> int:
  """Delete every entry in a cache folder (local or a bucket URL); returns how many were removed."""
  from jaxpod.runtime import storage
  fs, root = storage.filesystem(path)
  if not fs.exists(root):
    return 0
  files = fs.find(root)
  for f in files:
    fs.rm_file(f)
  return len(files)
