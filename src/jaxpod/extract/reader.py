"""Read an activation dataset back as one dataset in sample order: `jaxpod.extract.open(URL)`.

    ds = jaxpod.extract.open("gs://bucket/acts")      # raises if a row is missing or repeated
    ds.keys                                           # ("resid.4", "resid.8", ...)
    x = ds["resid.4"]                                 # [N, T, D] numpy, sample order
    for batch in ds.iter_batches(256, drop_padding=True):
      batch["resid.4"]                                # [n_tokens, D], real tokens only
      batch["row_ids"], batch["positions"]            # which sample and token each row is

Only the row ids of each shard file are read at open; activations are read one extraction
batch at a time while iterating.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Iterator, Sequence

import numpy as np

from jaxpod.extract import writer


class IncompleteDataset(ValueError):
  """Some rows are missing or present more than once; the message says which."""


@dataclasses.dataclass(frozen=True)
class Completeness:
  """Which of the rows 0..N-1 the shard files hold, and how often."""

  num_rows: int
  missing: np.ndarray  # row ids with no shard file
  duplicated: np.ndarray  # row ids found more than once

  @property
  def ok(self) -> bool:
    return not len(self.missing) and not len(self.duplicated)

  def describe(self) -> str:
    if self.ok:
      return f"complete: all {self.num_rows} rows exactly once"
    parts = []
    if len(self.missing):
      parts.append(f"{len(self.missing)} of {self.num_rows} rows missing ({_ranges(self.missing)})")
    if len(self.duplicated):
      parts.append(f"{len(self.duplicated)} rows more than once ({_ranges(self.duplicated)})")
    return "; ".join(parts)


def _ranges(ids: np.ndarray, limit: int = 6) -> str:
  """`0-7, 16, 20-23 ...` for sorted ids."""
  ids = np.unique(ids)
  breaks = np.flatnonzero(np.diff(ids) != 1) + 1
  runs = [(int(r[0]), int(r[-1])) for r in np.split(ids, breaks)]
  text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs[:limit])
  return text + (" ..." if len(runs) > limit else "")


class Dataset:
  """An extracted dataset: arrays per `point.layer` key, rows in prompt order."""

  def __init__(self, url: str, strict: bool = True):
    self.storage = writer.Storage(url)
    self.url = url
    manifest = self.storage.read_json(self.storage.path("manifest.json"))
    self.info = manifest or self.storage.read_json(self.storage.path("run.json"))
    if self.info is None:
      raise FileNotFoundError(f"{url} holds no activation dataset (no run.json); check the URL")
    self.finished = manifest is not None
    self.keys: tuple[str, ...] = tuple(self.info["keys"])
    self.num_rows, self.seq_len = int(self.info["num_rows"]), int(self.info["seq_len"])
    self.batch_size = int(self.info["batch_size"])
    self._files = self._index()
    self.completeness = self._check()
    if strict and not self.completeness.ok:
      state = "" if self.finished else " (the run has not finished: no manifest.json)"
      raise IncompleteDataset(f"{url}: {self.completeness.describe()}{state}; rerun the same `jaxpod extract` "
                              "to fill it, or open(..., strict=False) to read what is there")

  # ------------------------------------------------------------------ index
  def _read(self, path: str, names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    if self.storage.local:
      return _read_local(path, names)
    if names is None:
      return writer.decode(self.storage.fs.cat_file(path))[0]
    return writer.read_ranged(self.storage.fs, path, names)

  def _index(self) -> dict[int, list[tuple[str, np.ndarray]]]:
    """batch -> [(shard path, its row ids)] for this run's shard files."""
    files: dict[int, list[tuple[str, np.ndarray]]] = {}
    for path in self.storage.list_shards():
      name = path.rsplit("/", 1)[1]
      batch = int(name[1:7])
      files.setdefault(batch, []).append((path, self._read(path, ["row_ids"])["row_ids"]))
    return files

  def _check(self) -> Completeness:
    ids = [r for fs in self._files.values() for _, r in fs]
    counts = np.bincount(np.concatenate(ids) if ids else np.zeros(0, np.int64), minlength=self.num_rows)
    return Completeness(self.num_rows, np.flatnonzero(counts == 0), np.flatnonzero(counts > 1))

  # ------------------------------------------------------------------ access
  def __len__(self) -> int:
    return self.num_rows

  @property
  def layers(self) -> list[int]:
    return list(self.info["layers"])

  @property
  def points(self) -> list[str]:
    return list(self.info["points"])

  @property
  def dtype(self) -> str:
    return self.info["dtype"]

  def shape(self, key: str) -> tuple[int, ...]:
    return tuple(self.info["shapes"][key])

  def _batch(self, b: int, names: Sequence[str]) -> dict[str, np.ndarray]:
    """Rows of extraction batch b in sample order (only those present)."""
    parts = [dict(self._read(p, ["row_ids", *names]), row_ids=r) for p, r in self._files.get(b, [])]
    if not parts:
      return {n: np.zeros((0,), np.int64) for n in ["row_ids", *names]}
    joined = {n: np.concatenate([p[n] for p in parts]) for n in ["row_ids", *names]}
    _, first = np.unique(joined["row_ids"], return_index=True)  # sorted rows; duplicates read once
    return {n: v[first] for n, v in joined.items()}

  def iter_batches(self, batch_size: int | None = None, keys: Sequence[str] | None = None,
                   drop_padding: bool = False) -> Iterator[dict[str, np.ndarray]]:
    """Batches of `batch_size` rows in sample order: row_ids, tokens, mask and each key [b, T, D].

    drop_padding=True yields the real tokens only, flattened: each key [n, D], plus
    row_ids [n] and positions [n] saying which sample and token each row is.
    """
    keys = self._keys(keys)
    names = ["tokens", "mask", *keys]
    size = batch_size or self.batch_size
    pending: list[dict[str, np.ndarray]] = []
    have = 0
    for b in range(int(self.info["num_batches"])):
      got = self._batch(b, names)
      if len(got["row_ids"]):
        pending.append(got)
        have += len(got["row_ids"])
      while have >= size:
        chunk, pending, have = _take(pending, size, have)
        yield _finish(chunk, keys, drop_padding)
    if have:
      yield _finish(_take(pending, have, have)[0], keys, drop_padding)

  def _keys(self, keys: Sequence[str] | None) -> list[str]:
    keys = list(self.keys if keys is None else keys)
    bad = [k for k in keys if k not in self.keys]
    if bad:
      raise KeyError(f"{bad} not in this dataset; it holds {list(self.keys)}")
    return keys

  def array(self, key: str, drop_padding: bool = False) -> np.ndarray:
    """The whole array of `key` in sample order ([N, T, D], or [tokens, D] without padding)."""
    parts = [b[key] for b in self.iter_batches(keys=[key], drop_padding=drop_padding)]
    return np.concatenate(parts) if parts else np.zeros((0,), self.dtype)

  def __getitem__(self, key: str) -> np.ndarray:
    return self.array(key)

  @property
  def tokens(self) -> np.ndarray:
    """[N, T] token ids (padding included; see `mask`)."""
    return np.concatenate([b["tokens"] for b in self.iter_batches(keys=[])])

  @property
  def mask(self) -> np.ndarray:
    """[N, T] bool: True at real tokens."""
    return np.concatenate([b["mask"] for b in self.iter_batches(keys=[])])

  def summary(self) -> dict:
    """What `jaxpod extract info` prints."""
    return {"url": self.url, "finished": self.finished, "completeness": self.completeness.describe(),
            "model": self.info["model"], "layers": self.layers, "points": self.points, "dtype": self.dtype,
            "rows": self.num_rows, "seq_len": self.seq_len, "hidden_size": self.info["hidden_size"],
            "tokens": self.info.get("counts", {}).get("tokens"), "hosts": self.info["hosts"],
            "mesh": self.info["mesh"], "forward": self.info.get("forward", "exact"),  # older runs: exact only
            "shard_files": sum(len(v) for v in self._files.values()),
            "shapes": self.info["shapes"]}


def _take(pending: list[dict], size: int, have: int) -> tuple[dict, list[dict], int]:
  """The first `size` rows of the pending pieces, and what is left."""
  joined = {n: np.concatenate([p[n] for p in pending]) for n in pending[0]}
  head = {n: v[:size] for n, v in joined.items()}
  rest = {n: v[size:] for n, v in joined.items()}
  return head, ([rest] if have > size else []), have - size


def _finish(chunk: dict, keys: Sequence[str], drop_padding: bool) -> dict:
  chunk["mask"] = chunk["mask"].astype(bool)
  if not drop_padding:
    return chunk
  m = chunk["mask"]
  rows, positions = np.nonzero(m)
  out = {k: chunk[k][m] for k in keys}
  out.update(row_ids=chunk["row_ids"][rows], positions=positions.astype(np.int32), tokens=chunk["tokens"][m])
  return out


def _read_local(path: str, names: Sequence[str] | None) -> dict[str, np.ndarray]:
  """Only the named tensors of a local shard file (safe_open reads them lazily; bf16 via the uint16 view)."""
  from safetensors import safe_open
  with safe_open(os.fspath(path), "numpy") as f:
    meta = writer.decode_meta(f.metadata())
    return {n: writer.restore_dtype(f.get_tensor(n), n, meta) for n in (f.keys() if names is None else names)}


def open(url: str, strict: bool = True) -> Dataset:  # noqa: A001 - `jaxpod.extract.open` reads like a file open
  """The dataset at `url` in sample order; strict: raise unless every row is present exactly once."""
  return Dataset(url, strict=strict)
