"""A multi-host client fetches each region once across its hosts, then spreads it on device.

An inference job whose layout replicates a parameter across its hosts (data parallel workers,
a tensor-parallel group per host) would otherwise pull every replica over the network: each host
the whole parameter. Instead every host fetches a 1/devices block of such a parameter (a *fetch
layout* over the same mesh, no replication), and one jitted identity with the target shardings
moves the blocks into place over the devices' interconnect (invariant 10). The layout is a pure
function of the shapes and the global shardings, so every host compiles the same program.
"""
from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from jaxpod.transfer.flatten import Index, norm_index, volume


def _largest_host_share(shape: tuple[int, ...], sharding: jax.sharding.Sharding) -> int:
  """Elements of the parameter held by the process that holds the most (distinct slices only)."""
  held: dict[int, set[Index]] = {}
  for device, idx in sharding.devices_indices_map(shape).items():
    held.setdefault(device.process_index, set()).add(norm_index(idx, shape))
  return max(sum(volume(i) for i in slices) for slices in held.values())


def _fetch_sharding(shape: tuple[int, ...], sharding: Any) -> Any:
  """The sharding to fetch one parameter into: split over every device along the first dimension the
  device count divides, when the target gives some host more than its share; else the target."""
  if not isinstance(sharding, NamedSharding) or sharding.is_fully_addressable:
    return sharding
  mesh = sharding.mesh
  processes = len({d.process_index for d in mesh.devices.flat})
  share = -(-int(np.prod(shape, dtype=np.int64)) // processes)
  if _largest_host_share(shape, sharding) <= share:
    return sharding
  for dim, n in enumerate(shape):
    if n % mesh.size == 0:
      return NamedSharding(mesh, PartitionSpec(*(None,) * dim, tuple(mesh.axis_names)))
  return sharding


def fetch_layout(like: Any) -> tuple[Any, bool]:
  """(`like` with each parameter on its fetch sharding, whether any differs from the target)."""
  changed = False

  def one(leaf):
    nonlocal changed
    target = getattr(leaf, "sharding", None)
    fetch = _fetch_sharding(tuple(leaf.shape), target) if target is not None else None
    if fetch is target:
      return leaf
    changed = True
    return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=fetch)
  return jax.tree_util.tree_map(one, like), changed


@functools.lru_cache(maxsize=8)
def _placer(shardings: tuple) -> Any:
  return jax.jit(lambda leaves: leaves, out_shardings=list(shardings))


def place(params: Any, like: Any) -> Any:
  """`params` (on the fetch layout) moved onto `like`'s shardings: one collective program, every host."""
  leaves, tree = jax.tree_util.tree_flatten(params)
  shardings = tuple(leaf.sharding for leaf in jax.tree_util.tree_leaves(like))
  return jax.tree_util.tree_unflatten(tree, _placer(shardings)(leaves))
