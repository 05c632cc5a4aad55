"""Per-host shard files and progress records of an activation dataset, through fsspec.

Layout under the output URL (every name deterministic, so a rewrite is idempotent):
  run.json                         leader, at start: what is being extracted (config, shapes, layout)
  shards/b{batch:06d}-h{host:04d}.safetensors   one per (batch, host) that owns rows of that batch
  progress/h{host:04d}.json        per host, written after its shard: {"run", "next_batch"}
  manifest.json                    leader, at the end: shapes and counts (the dataset is complete)

Only replica-0 pieces of a captured array are kept, each placed by its global index
(`shard.index`); rows are identified by their global index, never by arrival order
(DESIGN.md invariant 4; reference/llm.md "Activation extraction", bug 1).

safetensors 0.8 cannot save or `load(bytes)` bfloat16 numpy arrays: bf16 tensors are stored
as a uint16 view and their dtype recorded in the header metadata.
"""
from __future__ import annotations

import json
from typing import Mapping

import fsspec
import numpy as np

from jaxpod.runtime import storage

FORMAT = "jaxpod-extract/1"
META_KEY = "jaxpod"  # one metadata key: a JSON string with sorted keys, so headers are byte-stable


class Storage:
  """Paths and atomic writes under one output URL."""

  def __init__(self, url: str):
    self.url = url
    self.fs, root = fsspec.core.url_to_fs(url)
    self.root = root.rstrip("/")
    protocols = self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,)
    self.local = "file" in protocols or "local" in protocols

  def path(self, *parts: str) -> str:
    return "/".join((self.root,) + parts)

  def shard_path(self, batch: int, host: int) -> str:
    return self.path("shards", f"b{batch:06d}-h{host:04d}.safetensors")

  def progress_path(self, host: int) -> str:
    return self.path("progress", f"h{host:04d}.json")

  def write_atomic(self, path: str, data: bytes) -> None:
    """Readers see the old content or the new one, never a part (`runtime.storage.write_bytes`)."""
    storage.write_bytes(path if self.local else self.fs.unstrip_protocol(path), data)

  def read_bytes(self, path: str) -> bytes | None:
    try:  # no exists() first: an object store's cached listing may predate another host's write
      return self.fs.cat_file(path)
    except FileNotFoundError:
      return None

  def read_json(self, path: str) -> dict | None:
    raw = self.read_bytes(path)
    return None if raw is None else json.loads(raw)

  def write_json(self, path: str, obj: dict) -> None:
    self.write_atomic(path, (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode())

  def remove_temporaries(self) -> None:
    """Delete temporaries left by a killed run (local storage only; call before any host writes)."""
    if self.local:
      for folder in ("shards", "progress"):
        for p in self.fs.glob(self.path(folder, "*.tmp-*")):
          self.fs.rm_file(p)

  def list_shards(self) -> list[str]:
    """Shard file paths (complete files only: temporaries are skipped), sorted by name."""
    folder = self.path("shards")
    self.fs.invalidate_cache(folder)  # object-store listings are cached per process; other hosts wrote since
    if not self.fs.exists(folder):
      return []
    return sorted(p for p in self.fs.ls(folder, detail=False) if p.endswith(".safetensors"))


# ---------------------------------------------------------------------------- device -> host
def replica0_rows(x) -> tuple[np.ndarray, np.ndarray]:
  """(global row ids along axis 0, values) of this host's replica-0 pieces of jax.Array `x`.

  Each piece lands at its global index; a host whose pieces do not cover whole rows (a
  non-batch axis sharded across hosts) raises instead of writing a partial row.
  """
  n = x.shape[0]
  pieces = [s for s in x.addressable_shards if s.replica_id == 0]
  ranges = [range(*s.index[0].indices(n)) if s.index else range(n) for s in pieces]
  rows = np.asarray(sorted(set().union(*ranges)), np.int64) if pieces else np.zeros((0,), np.int64)
  out = np.empty((len(rows),) + tuple(x.shape[1:]), x.dtype)
  covered = 0
  for s, r in zip(pieces, ranges):
    if not len(r):
      continue
    at = int(np.searchsorted(rows, r.start))  # rows is sorted and holds all of r: a contiguous block
    data = np.asarray(s.data)
    out[(slice(at, at + len(r)),) + tuple(s.index[1:])] = data
    covered += data.size
  if covered != out.size:
    raise RuntimeError(f"host holds replica-0 pieces covering {covered} of {out.size} values of its rows "
                       f"(array {tuple(x.shape)}, sharding {x.sharding}); captures must keep every axis but "
                       "the batch axis whole on each device")
  return rows, out


# ---------------------------------------------------------------------------- shard files
def encode(tensors: Mapping[str, np.ndarray], meta: dict) -> bytes:
  """safetensors bytes; bf16 arrays go in as uint16 views, their dtype in the metadata."""
  from safetensors.numpy import save
  dtypes, plain = {}, {}
  for name, a in tensors.items():
    a = np.ascontiguousarray(a)
    dtypes[name] = a.dtype.name
    plain[name] = a.view(np.uint16) if a.dtype.name == "bfloat16" else a
  header = dict(meta, format=FORMAT, dtypes=dtypes)
  return save(plain, metadata={META_KEY: json.dumps(header, sort_keys=True)})


def decode(raw: bytes, names=None) -> tuple[dict[str, np.ndarray], dict]:
  """(tensors, metadata) from safetensors bytes written by `encode` (only `names` if given)."""
  from safetensors.numpy import load
  meta = decode_meta(_metadata(raw))
  tensors = load(raw)
  wanted = tensors if names is None else names
  return {n: restore_dtype(tensors[n], n, meta) for n in wanted}, meta


def decode_meta(metadata: dict | None) -> dict:
  """jaxpod's header fields from a safetensors __metadata__ dict."""
  return json.loads((metadata or {}).get(META_KEY, "{}"))


def restore_dtype(a: np.ndarray, name: str, meta: dict) -> np.ndarray:
  """The stored array under its recorded dtype (uint16 -> bfloat16)."""
  dt = meta.get("dtypes", {}).get(name, a.dtype.name)
  return a.view(_np_dtype(dt)) if dt != a.dtype.name else a


_ST_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "I64": "int64", "I32": "int32",
              "I16": "int16", "I8": "int8", "U64": "uint64", "U32": "uint32", "U16": "uint16", "U8": "uint8",
              "BOOL": "bool"}


def read_ranged(fs, path: str, names) -> dict[str, np.ndarray]:
  """Only the named tensors of a remote shard file, by ranged reads (header first, then each tensor)."""
  size = int.from_bytes(fs.cat_file(path, start=0, end=8), "little")
  header = json.loads(fs.cat_file(path, start=8, end=8 + size))
  meta = decode_meta(header.get("__metadata__"))
  out = {}
  for name in names:
    info = header[name]
    lo, hi = info["data_offsets"]
    raw = fs.cat_file(path, start=8 + size + lo, end=8 + size + hi)
    a = np.frombuffer(raw, dtype=_ST_DTYPES[info["dtype"]]).reshape(info["shape"])
    out[name] = restore_dtype(a, name, meta)
  return out


def _metadata(raw: bytes) -> dict:
  """The safetensors header's __metadata__ (8-byte little-endian size, then a JSON header)."""
  size = int.from_bytes(raw[:8], "little")
  return json.loads(raw[8:8 + size]).get("__metadata__") or {}


def _np_dtype(name: str):
  if name == "bfloat16":
    import ml_dtypes
    return np.dtype(ml_dtypes.bfloat16)
  return np.dtype(name)


def write_shard(storage: Storage, batch: int, host: int, tensors: Mapping[str, np.ndarray], meta: dict) -> str:
  """Write this host's shard of `batch` (row_ids, tokens, mask, activations); returns its path."""
  path = storage.shard_path(batch, host)
  storage.write_atomic(path, encode(tensors, dict(meta, batch=batch, host=host)))
  return path


def commit(storage: Storage, host: int, run_id: str, next_batch: int) -> None:
  """Record that `host` has written every batch before `next_batch` (call after its shard)."""
  storage.write_json(storage.progress_path(host), {"host": host, "next_batch": next_batch, "run": run_id})


def committed(storage: Storage, host: int, run_id: str) -> int:
  """The first batch `host` has not committed under this run (0 if none or another run's record)."""
  rec = storage.read_json(storage.progress_path(host))
  return int(rec["next_batch"]) if rec and rec.get("run") == run_id else 0
