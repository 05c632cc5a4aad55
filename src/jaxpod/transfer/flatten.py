"""Pytree <-> named flat arrays ("pieces"), and reassembly onto the client's own shardings.

The trainer side turns each array into the pieces this process owns: the addressable shards
with `replica_id == 0` (a fully addressable array is one piece, sent by the leader only), so
a multi-host trainer sends every element exactly once, never N replicas. A piece is a numpy
array plus the slice of the global array it covers. The client side fills one host buffer
per parameter from the pieces (any order, any layout) and places it on the shardings of its
`like` pytree of `ShapeDtypeStruct`s, which may use a different mesh than the trainer's.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable

import jax
import jax.numpy as jnp
import numpy as np

Index = tuple[tuple[int, int], ...]  # [start, stop) per dimension of the global array


@dataclasses.dataclass(frozen=True)
class Piece:
  """One contiguous block of one parameter, as sent on the wire."""

  name: str
  index: Index
  data: np.ndarray  # C-contiguous, in the wire dtype

  def meta(self) -> dict:
    """JSON-able description (everything but the bytes)."""
    return {"name": self.name, "index": [list(i) for i in self.index], "nbytes": int(self.data.nbytes)}


def aligned_empty(nbytes: int, align: int = 64) -> np.ndarray:
  """An uninitialised uint8 buffer whose start is `align`-byte aligned.

  XLA's CPU client adopts an aligned host buffer without copying (measured: ~0.8 GB/s copy
  for a 16-byte aligned buffer vs instant for a 64-byte aligned one), so placing received
  bytes costs nothing on CPU. Buffers are never reused after placement."""
  raw = np.empty(nbytes + align, np.uint8)
  off = (-raw.ctypes.data) % align
  return raw[off:off + nbytes]


def leaf_names(tree: Any) -> list[tuple[str, Any]]:
  """(name, leaf) pairs in tree order; names are '/'-joined keys ("layers/0/w")."""
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  return [(jax.tree_util.keystr(path, simple=True, separator="/"), leaf) for path, leaf in flat]


def _dtype(name: str) -> np.dtype:
  return np.dtype(jnp.dtype(name))


def _wire(dtype: np.dtype, wire_dtype: str | None) -> np.dtype:
  if wire_dtype and jnp.issubdtype(dtype, jnp.floating):
    return _dtype(wire_dtype)
  return np.dtype(dtype)


def _norm_index(index: tuple, shape: tuple[int, ...]) -> Index:
  return tuple((s.start or 0, shape[d] if s.stop is None else s.stop) for d, s in enumerate(index))


def _host(x: Any, wire: np.dtype, own: bool) -> np.ndarray:
  """C-contiguous host copy in the wire dtype; `own` forces a copy even where numpy could view."""
  data = np.asarray(x).astype(wire, copy=False)
  if own and not data.flags.owndata:
    out = aligned_empty(data.nbytes).view(wire).reshape(data.shape)
    np.copyto(out, data)
    return out
  return np.ascontiguousarray(data)


def to_pieces(params: Any, wire_dtype: str | None = None, leader: bool = True,
              own: bool = False) -> tuple[dict, list[Piece]]:
  """(parameter table, this process's pieces): replica 0 of each addressable shard only; arrays
  that live on one process (fully addressable) are sent by the `leader` only. With `own`, the
  pieces never alias the trainer's buffers (which its next step may donate)."""
  table, pieces = {}, []
  for name, leaf in leaf_names(params):
    shape, dtype = tuple(np.shape(leaf)), np.dtype(leaf.dtype) if hasattr(leaf, "dtype") else np.asarray(leaf).dtype
    wire = _wire(dtype, wire_dtype)
    table[name] = {"shape": list(shape), "dtype": jnp.dtype(dtype).name, "wire": jnp.dtype(wire).name}
    if not isinstance(leaf, jax.Array) or leaf.is_fully_addressable:
      if leader:
        pieces.append(Piece(name, tuple((0, n) for n in shape), _host(leaf, wire, own)))
      continue
    for shard in leaf.addressable_shards:
      if shard.replica_id == 0:
        pieces.append(Piece(name, _norm_index(shard.index, shape), _host(shard.data, wire, own)))
  return table, pieces


class Assembler:
  """Collects pieces into one host buffer per parameter, then places them like `like`."""

  def __init__(self, table: dict, like: Any):
    self.table = table
    self.like = like
    self.names = [n for n, _ in leaf_names(like)]
    missing = sorted(set(self.names) - set(table))
    extra = sorted(set(table) - set(self.names))
    if missing or extra:
      raise ValueError(f"published parameters differ from `like`: missing on the wire {missing[:5]}, "
                       f"not in `like` {extra[:5]}; build `like` from the same model as the trainer")
    for name, leaf in leaf_names(like):
      if list(leaf.shape) != table[name]["shape"]:
        raise ValueError(f"parameter {name!r}: trainer shape {table[name]['shape']} != like shape {list(leaf.shape)}")
    self.buffers: dict[str, np.ndarray] = {}
    self.filled: dict[str, int] = {n: 0 for n in self.names}

  def empty(self, meta: dict) -> np.ndarray:
    """A writable uint8 buffer for one piece's bytes (filled by the transport, then `put`)."""
    return aligned_empty(meta["nbytes"])

  def put_bytes(self, meta: dict, raw: np.ndarray | memoryview | bytes) -> None:
    """Add a piece given as raw bytes in the wire dtype."""
    info = self.table[meta["name"]]
    shape = [b - a for a, b in meta["index"]]
    self.put(meta, np.frombuffer(raw, _dtype(info["wire"])).reshape(shape))

  def put(self, meta: dict, data: np.ndarray) -> None:
    """Add a piece given as an array of the piece's shape."""
    name, index = meta["name"], meta["index"]
    info = self.table[name]
    shape = tuple(info["shape"])
    if all(a == 0 and b == n for (a, b), n in zip(index, shape)):
      self.buffers[name] = data.reshape(shape)  # whole parameter: no copy
    else:
      buf = self.buffers.get(name)
      if buf is None:
        wire = _dtype(info["wire"])
        nbytes = int(np.prod(shape, dtype=np.int64)) * wire.itemsize
        buf = self.buffers[name] = aligned_empty(nbytes).view(wire).reshape(shape)
      buf[tuple(slice(a, b) for a, b in index)] = data
    self.filled[name] += int(np.prod([b - a for a, b in index], dtype=np.int64))

  def finish(self) -> Any:
    """The pytree of jax.Arrays on `like`'s shardings; raises if any element never arrived."""
    leaves = []
    for name, leaf in leaf_names(self.like):
      size = int(np.prod(self.table[name]["shape"], dtype=np.int64))
      if self.filled[name] != size:
        raise RuntimeError(f"parameter {name!r}: {self.filled[name]} of {size} elements arrived")
      host = self.buffers.get(name, np.empty(self.table[name]["shape"], _dtype(self.table[name]["wire"])))
      host = host.astype(np.dtype(leaf.dtype), copy=False)
      sharding = getattr(leaf, "sharding", None)
      if sharding is None:
        leaves.append(jnp.asarray(host))
      else:
        leaves.append(jax.make_array_from_callback(host.shape, sharding, lambda idx, h=host: h[idx]))
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(self.like), leaves)


def abstract(params: Any) -> Any:
  """`ShapeDtypeStruct`s (with shardings) of a pytree of arrays: a `like` for the same layout."""
  return jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=getattr(x, "sharding", None)), params)


def total_bytes(pieces: Iterable[Piece]) -> int:
  """Bytes on the wire for a list of pieces."""
  return sum(int(p.data.nbytes) for p in pieces)
