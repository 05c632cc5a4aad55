"""Row stores: the leader writes an array once in chunks, every host reads and verifies only its rows.

    writer = RowWriter("gs://b/cache/lm-rows-x", chunk_rows=8192)  # leader
    writer.append(tokens=rows_KxT)                                  # any number of times, bounded memory
    sha256 = writer.close()                                         # the manifest's sha256: broadcast it
    store = RowStore("gs://b/cache/lm-rows-x", sha256)              # every host
    store.read([7, 3, 900])                                         # {"tokens": [3, T]}: only those rows' bytes
    store.bytes_read                                                # what this host fetched, counted at the client

Layout under the store's URL (a folder or a bucket prefix): `chunk-00000.npy`, ... (standard .npy files of
`chunk_rows` records each; a record holds every field of one row, so one byte range reads a row), `digests.npy`
([N] uint64: an 8-byte BLAKE2b of each row's bytes) and `manifest.json` (fields, rows, and per chunk its file,
first row, row count, header size and the sha256 of its rows' digests). The manifest is written last: its
presence means the store is complete. Its sha256 is all that crosses the control plane (invariant 2).

Reading a row fetches its byte range (`cat_ranges`: every range of a call in flight together on object stores)
and the digest block of its chunk (once; verified against the chunk's sha256), then checks the row against its
digest. So a host that reads 1/hosts of the rows moves ~1/hosts of the bytes (invariant 10), and a changed or
damaged chunk is named in one line with the fix, whichever host reads it.
"""
from __future__ import annotations

import hashlib
import io
import json
from typing import Sequence

import numpy as np

from jaxpod.runtime import storage

CHUNK_BYTES = 64 << 20  # default chunk size when chunk_rows is not given
MANIFEST, DIGESTS, FORMAT = "manifest.json", "digests.npy", "jaxpod.rows/1"


def _row_digests(records: np.ndarray) -> np.ndarray:
  """[K] uint64: an 8-byte BLAKE2b of each record's bytes."""
  raw = records.view(np.uint8).reshape(len(records), -1)
  return np.frombuffer(b"".join(hashlib.blake2b(r.tobytes(), digest_size=8).digest() for r in raw), np.uint64)


def _npy_bytes(array: np.ndarray) -> bytes:
  buf = io.BytesIO()
  np.save(buf, array, allow_pickle=False)
  return buf.getvalue()


class RowWriter:
  """Leader: appends rows in batches and writes them as chunk files; `close()` writes digests and manifest."""

  def __init__(self, url: str, chunk_rows: int = 0):
    self.url, self.chunk_rows = storage.absolute(url), chunk_rows
    self.dtype: np.dtype | None = None
    self.pending: list[np.ndarray] = []
    self.pending_rows = self.rows = 0
    self.chunks: list[dict] = []
    self.digests: list[np.ndarray] = []

  def append(self, **fields: np.ndarray) -> None:
    """Add rows: every field an array [K, *row_shape] with the same K (the same fields and shapes every call)."""
    counts = {len(v) for v in fields.values()}
    if len(counts) != 1:
      raise ValueError(f"{self.url}: fields {sorted(fields)} have different row counts {sorted(counts)}")
    dtype = np.dtype([(k, v.dtype, v.shape[1:]) for k, v in fields.items()])
    if self.dtype is None:
      self.dtype = dtype
      self.chunk_rows = self.chunk_rows or max(1, CHUNK_BYTES // max(dtype.itemsize, 1))
    elif dtype != self.dtype:
      raise ValueError(f"{self.url}: rows of {dtype} appended to a store of {self.dtype}")
    records = np.empty(counts.pop(), self.dtype)
    for k, v in fields.items():
      records[k] = v
    self.pending.append(records)
    self.pending_rows += len(records)
    while self.pending_rows >= self.chunk_rows:
      self._flush(self.chunk_rows)

  def _flush(self, count: int) -> None:
    records = np.concatenate(self.pending) if len(self.pending) > 1 else self.pending[0]
    chunk, rest = records[:count], records[count:]
    self.pending, self.pending_rows = ([rest] if len(rest) else []), len(rest)
    blob = _npy_bytes(chunk)
    name = f"chunk-{len(self.chunks):05d}.npy"
    storage.write_bytes(storage.join(self.url, name), blob)
    digests = _row_digests(chunk)
    self.digests.append(digests)
    self.chunks.append({"file": name, "start": self.rows, "rows": len(chunk), "header": len(blob) - chunk.nbytes,
                        "sha256": hashlib.sha256(digests.tobytes()).hexdigest()})
    self.rows += len(chunk)

  def close(self) -> str:
    """Write the last chunk, the digests and the manifest; returns the manifest's sha256 (for hosts to check)."""
    if self.dtype is None:
      raise ValueError(f"{self.url}: no rows were written; the data gave no rows")
    if self.pending_rows:
      self._flush(self.pending_rows)
    digests = np.concatenate(self.digests)
    blob = _npy_bytes(digests)
    storage.write_bytes(storage.join(self.url, DIGESTS), blob)
    manifest = {"format": FORMAT, "rows": self.rows, "chunk_rows": self.chunk_rows,
                "fields": [[k, self.dtype[k].base.str, list(self.dtype[k].shape)] for k in self.dtype.names],
                "record_bytes": self.dtype.itemsize, "digests_header": len(blob) - digests.nbytes,
                "chunks": self.chunks}
    text = json.dumps(manifest, separators=(",", ":")).encode()
    storage.write_bytes(storage.join(self.url, MANIFEST), text)
    return hashlib.sha256(text).hexdigest()


def write_rows(url: str, fields: dict[str, np.ndarray], chunk_rows: int = 0) -> str:
  """Leader: store whole arrays [N, ...] as a row store at `url`; the manifest's sha256."""
  writer = RowWriter(url, chunk_rows)
  writer.append(**fields)
  return writer.close()


def manifest_sha256(url: str) -> str | None:
  """The sha256 of a complete store's manifest (None: no complete store at `url`)."""
  path = storage.join(url, MANIFEST)
  return hashlib.sha256(storage.read_bytes(path)).hexdigest() if storage.exists(path) else None


class ArrayRows:
  """Rows held in memory, with RowStore's reading interface (a single process, tests)."""

  def __init__(self, fields: dict[str, np.ndarray]):
    self.fields = fields
    self.num_rows = len(next(iter(fields.values())))
    self.bytes_read = 0

  def read(self, indices: Sequence[int]) -> dict[str, np.ndarray]:
    """{field: [len(indices), ...]}: those rows, in the order given."""
    idx = np.asarray(indices, np.int64)
    return {k: v[idx] for k, v in self.fields.items()}


class WithColumns:
  """A row source plus per-row columns held in memory (e.g. [N, 2] reference log-probs beside stored pairs)."""

  def __init__(self, rows, columns: dict[str, np.ndarray]):
    self.rows, self.columns, self.num_rows = rows, columns, rows.num_rows

  @property
  def bytes_read(self) -> int:
    return self.rows.bytes_read

  def read(self, indices: Sequence[int]) -> dict[str, np.ndarray]:
    idx = np.asarray(indices, np.int64)
    return {**self.rows.read(idx), **{k: v[idx] for k, v in self.columns.items()}}


class RowStore:
  """Every host: a store the leader wrote, read by row ranges; each row checked against its chunk's sha256."""

  def __init__(self, url: str, sha256: str | None = None):
    self.url = storage.absolute(url)
    self.bytes_read = 0  # every byte this process fetched from the store (manifest, digests, rows)
    self.fs, self.root = storage.filesystem(self.url)
    path = storage.join(self.url, MANIFEST)
    try:
      text = self._cat(self.root.rstrip("/") + "/" + MANIFEST)
    except FileNotFoundError:
      raise FileNotFoundError(f"{path}: no row store there; the leader writes it first (is the data cache shared "
                              "storage every host sees, a bucket URL?)") from None
    if sha256 is not None and hashlib.sha256(text).hexdigest() != sha256:
      raise ValueError(f"{path} changed since the leader wrote it (sha256 differs); is another run writing the same "
                       "data cache? rerun, or set task.data.cache_dir to a folder of this run's own")
    m = json.loads(text)
    if m.get("format") != FORMAT:
      raise ValueError(f"{path}: format {m.get('format')!r}, expected {FORMAT!r}; delete {self.url} and rerun")
    self.manifest, self.num_rows = m, int(m["rows"])
    self.dtype = np.dtype([(k, np.dtype(d), tuple(s)) for k, d, s in m["fields"]])
    self.starts = np.asarray([c["start"] for c in m["chunks"]], np.int64)
    self._digests: dict[int, np.ndarray] = {}  # chunk -> its verified row digests

  def _path(self, name: str) -> str:
    return self.root.rstrip("/") + "/" + name

  def _cat(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
    blob = self.fs.cat_file(path, start=start, end=end)
    self.bytes_read += len(blob)
    return blob

  def _chunk_digests(self, c: int) -> np.ndarray:
    """Chunk c's row digests, read once from digests.npy and checked against the manifest."""
    if c not in self._digests:
      chunk, head = self.manifest["chunks"][c], self.manifest["digests_header"]
      blob = self._cat(self._path(DIGESTS), head + 8 * chunk["start"], head + 8 * (chunk["start"] + chunk["rows"]))
      if hashlib.sha256(blob).hexdigest() != chunk["sha256"]:
        self._damaged(c, f"its digests in {DIGESTS} differ from the manifest's sha256")
      self._digests[c] = np.frombuffer(blob, np.uint64)
    return self._digests[c]

  def _damaged(self, c: int, what: str):
    raise ValueError(f"{storage.join(self.url, self.manifest['chunks'][c]['file'])} (chunk {c}): {what}; the "
                     f"data cache is damaged or was rewritten: delete {self.url} and rerun (the leader rebuilds it)")

  def read(self, indices: Sequence[int]) -> dict[str, np.ndarray]:
    """{field: [len(indices), ...]}: those rows in the order given; only their bytes are fetched."""
    idx = np.asarray(indices, np.int64)
    if len(idx) and (idx.min() < 0 or idx.max() >= self.num_rows):
      raise IndexError(f"{self.url}: rows {idx.min()}..{idx.max()} outside 0..{self.num_rows - 1}")
    wanted = np.unique(idx)
    chunk_of = np.searchsorted(self.starts, wanted, side="right") - 1
    # runs of consecutive rows within one chunk: one byte range each
    cut = np.flatnonzero((np.diff(wanted) != 1) | (np.diff(chunk_of) != 0)) + 1
    runs = [(int(r[0]), len(r), int(c[0])) for r, c in zip(np.split(wanted, cut), np.split(chunk_of, cut)) if len(r)]
    size, chunks = self.dtype.itemsize, self.manifest["chunks"]
    paths = [self._path(chunks[c]["file"]) for _, _, c in runs]
    starts = [chunks[c]["header"] + (first - chunks[c]["start"]) * size for first, _, c in runs]
    ends = [s + n * size for s, (_, n, _) in zip(starts, runs)]
    blobs = self.fs.cat_ranges(paths, starts, ends) if runs else []
    out = np.empty(len(wanted), self.dtype)
    at = 0
    for blob, (first, n, c) in zip(blobs, runs):
      if isinstance(blob, Exception) or len(blob) != n * size:
        why = (f"{type(blob).__name__}: {str(blob).splitlines()[0][:160] if str(blob) else ''}"
               if isinstance(blob, Exception) else f"{len(blob)} of {n * size} bytes")
        self._damaged(c, f"rows {first}..{first + n - 1} could not be read whole ({why})")
      self.bytes_read += len(blob)
      records = np.frombuffer(blob, self.dtype)
      local = first - chunks[c]["start"]
      if not np.array_equal(_row_digests(records), self._chunk_digests(c)[local:local + n]):
        self._damaged(c, f"rows {first}..{first + n - 1} differ from what the leader wrote (row digests)")
      out[at:at + n] = records
      at += n
    picked = out[np.searchsorted(wanted, idx)]
    return {k: np.ascontiguousarray(picked[k]) for k in self.dtype.names}

  def read_all(self) -> dict[str, np.ndarray]:
    """Every row (a single process: tests, tools); verified like any read."""
    return self.read(np.arange(self.num_rows))
