"""Where a tensor's bytes live on a (data, fsdp, model) mesh: per device, per host, served per host.

The mesh is laid out as `runtime.make_mesh` lays it out: devices in process order reshaped to
(data, fsdp, model), so each host holds a contiguous block of the flattened grid. A dimension's
logical axis maps to mesh axes through jaxpod's sharding rules (`runtime.sharding.DEFAULT_RULES`);
axes that do not divide the dimension are dropped (replicated), as the default "warn" policy does.

"Needed" bytes of a host are the distinct shards its devices hold (what a ranged load reads);
"served" bytes spread each shard over the hosts holding it, by bytes (what a replica-aware publish,
export or checkpoint writes per host).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from jaxpod.plan.model import Tensor
from jaxpod.runtime.mesh import MESH_AXES
from jaxpod.runtime.sharding import DEFAULT as RULES


@dataclasses.dataclass(frozen=True)
class Layout:
  """A resolved mesh on a pod: axis sizes and the host of every device."""

  data: int
  fsdp: int
  model: int
  hosts: int

  @property
  def sizes(self) -> dict[str, int]:
    return dict(zip(MESH_AXES, (self.data, self.fsdp, self.model)))

  @property
  def devices(self) -> int:
    return self.data * self.fsdp * self.model


def split(t: Tensor, layout: Layout, drop: tuple[str, ...] = ()) -> tuple[int, ...]:
  """Ways each dimension of `t` is split (1: whole); mesh axes in `drop` are treated as absent."""
  table, sizes = RULES.as_dict(), layout.sizes
  out = []
  for dim, name in zip(t.shape, t.axes):
    axes = table.get(name) if name is not None else None
    axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
    ways = math.prod(sizes[a] for a in axes if a not in drop)
    out.append(ways if ways > 1 and dim % ways == 0 else 1)
  return tuple(out)


def device_elements(t: Tensor, layout: Layout, drop: tuple[str, ...] = ()) -> int:
  """Elements of `t` on one device."""
  return t.size // math.prod(split(t, layout, drop))


def _shard_ids(t: Tensor, layout: Layout) -> np.ndarray:
  """The shard index (0..shards-1) each device holds, devices in process order."""
  table, sizes = RULES.as_dict(), layout.sizes
  coords = np.indices((layout.data, layout.fsdp, layout.model)).reshape(3, -1)  # [3, devices]
  ids = np.zeros(layout.devices, np.int64)
  for dim, name, ways in zip(t.shape, t.axes, split(t, layout)):
    if ways == 1:
      continue
    axes = table.get(name)
    axes = (axes,) if isinstance(axes, str) else tuple(axes)
    index = np.zeros(layout.devices, np.int64)
    for a in axes:  # row-major over the mapped axes, as a PartitionSpec of several axes orders them
      index = index * sizes[a] + coords[MESH_AXES.index(a)]
    ids = ids * ways + index
  return ids


@dataclasses.dataclass(frozen=True)
class HostBytes:
  """Per-host bytes of a set of tensors on a layout (arrays indexed by host)."""

  needed: np.ndarray  # distinct shards this host's devices hold (what a ranged load reads)
  served: np.ndarray  # whole shards served, each by one holder, by bytes round-robin (publish)
  split: np.ndarray  # each shard split evenly over the hosts holding it (Orbax's replica-parallel save)
  largest: int  # the most bytes one host holds of a single tensor


def host_bytes(tensors: list[Tensor], layout: Layout, itemsize: int) -> HostBytes:
  """Per-host bytes of `tensors` on `layout`: held, served whole, served split, and the largest tensor's part."""
  per_host = layout.devices // layout.hosts
  needed = np.zeros(layout.hosts, np.int64)
  served = np.zeros(layout.hosts, np.int64)
  split_ = np.zeros(layout.hosts, np.int64)
  largest = 0
  cache: dict[tuple, tuple[np.ndarray, list[np.ndarray]]] = {}
  for t in tensors:
    key = (t.shape, t.axes)
    if key not in cache:
      ids = _shard_ids(t, layout).reshape(layout.hosts, per_host)
      counts = np.array([len(np.unique(row)) for row in ids])
      holders = [np.flatnonzero((ids == s).any(axis=1)) for s in range(int(ids.max()) + 1)]
      cache[key] = counts, holders
    counts, holders = cache[key]
    shard = device_elements(t, layout) * itemsize
    needed += counts * shard
    largest = max(largest, int(counts.max()) * shard)
    for hs in holders:  # each shard once, by the least-loaded host that holds it
      served[hs[np.argmin(served[hs])]] += shard
      split_[hs] += shard // len(hs)
  return HostBytes(needed, served, split_, largest)
