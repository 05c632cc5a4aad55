"""safetensors files by byte range: headers read with two ranged reads, tensors by row range, files written as
a header then streamed tensor bytes; per-host byte counters for what this process moved.

Format: 8-byte little-endian header length N, a JSON header `{name: {dtype, shape, data_offsets: [begin, end]},
"__metadata__": {...}}` (offsets relative to byte 8 + N), then the tensors, row-major. Rows of a tensor are
contiguous, so the rows a device needs are one range.

    fs, path = storage.filesystem("gs://b/ckpt/model-00001-of-00004.safetensors")
    header = read_header(fs, path)                      # {name: TensorInfo}; reads 8 + N bytes
    rows = read_rows(fs, path, header["lm_head.weight"], [(0, 512)])   # [np.ndarray [512, D]]
    counters()                                           # {"read": ..., "written": ..., "gathered": ...}

Counting is at the client (what fsspec returned or was handed), so it holds for gcsfs, whose socket reads
`/proc/<pid>/io` does not see. Model-agnostic: Llama's layout mapping lives in `models/llama/hf_io.py`.
"""
from __future__ import annotations

import dataclasses
import json
import math
import struct
import threading

import ml_dtypes
import numpy as np

DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
          "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2, "I64": np.int64, "I32": np.int32,
          "I16": np.int16, "I8": np.int8, "U64": np.uint64, "U32": np.uint32, "U16": np.uint16, "U8": np.uint8,
          "BOOL": np.bool_}
_NAMES = {np.dtype(v): k for k, v in DTYPES.items()}
MAX_HEADER_BYTES = 100 * 2 ** 20  # the safetensors library's own limit
PIECE_BYTES = 64 * 2 ** 20  # ranged reads are split into pieces of at most this, several in flight

_lock = threading.Lock()
_counts = {"read": 0, "written": 0, "gathered": 0}


def count(kind: str, nbytes: int) -> None:
  """Add `nbytes` to this process's counter `kind` ("read": downloaded, "written": uploaded or written to files,
  "gathered": tensor bytes received from other hosts to be written here)."""
  with _lock:
    _counts[kind] += int(nbytes)


def counters(reset: bool = False) -> dict[str, int]:
  """This process's byte counters since start (or the last reset)."""
  with _lock:
    out = dict(_counts)
    if reset:
      for k in _counts:
        _counts[k] = 0
  return out


@dataclasses.dataclass(frozen=True)
class TensorInfo:
  """Where one tensor lies in its file."""

  dtype: str  # safetensors dtype name, e.g. "BF16"
  shape: tuple[int, ...]  # as stored
  start: int  # absolute byte offset of its first byte in the file
  end: int  # absolute byte offset past its last byte

  @property
  def np_dtype(self) -> np.dtype:
    return np.dtype(DTYPES[self.dtype])

  @property
  def row_bytes(self) -> int:
    """Bytes of one row (index along dim 0); a scalar is one row."""
    return self.np_dtype.itemsize * math.prod(self.shape[1:])


def cat(fs, path: str, start: int, end: int) -> bytes:
  """Bytes [start, end) of `path`, counted."""
  data = fs.cat_file(path, start=start, end=end)
  count("read", len(data))
  return data


def read_header(fs, path: str) -> dict[str, TensorInfo]:
  """Every tensor's dtype, shape and absolute byte range, from two ranged reads (the file is not downloaded)."""
  (n,) = struct.unpack("<Q", cat(fs, path, 0, 8))
  if n > MAX_HEADER_BYTES:
    raise ValueError(f"{path}: safetensors header of {n} bytes (> {MAX_HEADER_BYTES}); not a safetensors file?")
  raw = json.loads(cat(fs, path, 8, 8 + n))
  base = 8 + n
  out = {}
  for name, h in raw.items():
    if name == "__metadata__":
      continue
    if h["dtype"] not in DTYPES:
      raise ValueError(f"{path}: tensor {name} has dtype {h['dtype']}, which jaxpod cannot read; use one of "
                       f"{sorted(DTYPES)}")
    b, e = h["data_offsets"]
    out[name] = TensorInfo(h["dtype"], tuple(h["shape"]), base + b, base + e)
  return out


def _merge(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
  """Sorted union of [start, stop) ranges (touching ones joined)."""
  out: list[list[int]] = []
  for a, b in sorted(set(ranges)):
    if out and a <= out[-1][1]:
      out[-1][1] = max(out[-1][1], b)
    else:
      out.append([a, b])
  return [(a, b) for a, b in out]


def read_rows(fs, path: str, info: TensorInfo, rows: list[tuple[int, int]]) -> list[np.ndarray]:
  """Rows [r0, r1) of the tensor for each requested pair, each array of shape [r1 - r0, *shape[1:]] (views into
  one buffer per merged range). Overlapping or repeated requests are read once."""
  merged = _merge([(r0, r1) for r0, r1 in rows if r1 > r0])
  bufs = {}
  for r0, r1 in merged:
    a, b = info.start + r0 * info.row_bytes, info.start + r1 * info.row_bytes
    buf = np.empty(b - a, np.uint8)
    pieces = [(s, min(s + PIECE_BYTES, b)) for s in range(a, b, PIECE_BYTES)]
    for i in range(0, len(pieces), 8):  # at most 8 pieces (512 MiB) in flight: bounded memory
      group = pieces[i:i + 8]
      for (s, e), data in zip(group, fs.cat_ranges([path] * len(group), [s for s, _ in group],
                                                    [e for _, e in group], on_error="raise")):
        if len(data) != e - s:
          raise ValueError(f"{path}: read {len(data)} bytes at {s}, expected {e - s}; the file is truncated")
        count("read", len(data))
        buf[s - a:e - a] = np.frombuffer(data, np.uint8)
    bufs[(r0, r1)] = buf.view(info.np_dtype).reshape((r1 - r0, *info.shape[1:]))
  out = []
  for r0, r1 in rows:
    m0, m1 = next(m for m in merged if m[0] <= r0 and r1 <= m[1]) if r1 > r0 else (r0, r0)
    out.append(bufs[(m0, m1)][r0 - m0:r1 - m0] if r1 > r0 else np.empty((0, *info.shape[1:]), info.np_dtype))
  return out


def dtype_name(dtype) -> str:
  """safetensors dtype name of a numpy/JAX dtype (float32 -> "F32")."""
  try:
    return _NAMES[np.dtype(dtype)]
  except KeyError:
    raise ValueError(f"dtype {dtype} has no safetensors name; use one of {sorted(DTYPES)}") from None


def header_bytes(entries: list[tuple[str, str, tuple[int, ...]]], metadata: dict | None = None) -> bytes:
  """8-byte length + JSON header for tensors (name, dtype name, shape) stored in this order, back to back;
  the JSON is padded with spaces to a multiple of 8 bytes, as the safetensors library writes it."""
  head: dict = {"__metadata__": metadata} if metadata else {}
  offset = 0
  for name, dt, shape in entries:
    n = np.dtype(DTYPES[dt]).itemsize * math.prod(shape)
    head[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [offset, offset + n]}
    offset += n
  raw = json.dumps(head, separators=(",", ":")).encode()
  raw += b" " * (-len(raw) % 8)
  return struct.pack("<Q", len(raw)) + raw


def group_files(sizes: list[tuple[str, int]], max_shard_bytes: int | None, single: str) -> dict[str, list[str]]:
  """file name -> tensor names in order: one `single` file, or HF-named shards `model-0000i-of-0000N.safetensors`
  of at most max_shard_bytes each (a larger tensor gets a file of its own)."""
  if not max_shard_bytes:
    return {single: [n for n, _ in sizes]}
  groups: list[list[str]] = [[]]
  size = 0
  for name, nbytes in sizes:
    if groups[-1] and size + nbytes > max_shard_bytes:
      groups.append([])
      size = 0
    groups[-1].append(name)
    size += nbytes
  if len(groups) == 1:
    return {single: groups[0]}
  n = len(groups)
  return {f"model-{i + 1:05d}-of-{n:05d}.safetensors": g for i, g in enumerate(groups)}


def assign_files(file_bytes: dict[str, int], hosts: int) -> dict[str, int]:
  """file name -> the host that writes it: largest files first, each to the host with the fewest bytes so far
  (ties to the lower index); deterministic, so every host computes the same plan."""
  load = [0] * hosts
  out = {}
  for name in sorted(file_bytes, key=lambda f: (-file_bytes[f], f)):
    h = min(range(hosts), key=lambda i: (load[i], i))
    out[name] = h
    load[h] += file_bytes[name]
  return out
