"""Whole arrays delivered to the one host that writes them, a few at a time: never the model on every host.

    for i, pieces in deliver(jobs, mesh):   # every host calls it with the same jobs, in the same order
      for p in pieces: f.write(p)            # job i is this host's: its bytes, row-major, in order

A job is a global array, the process that must receive it and a jittable `convert` (layout, dtype). Jobs go
in waves: each wave takes the next job of every owner's queue. Per job, one jitted call converts the array
and spreads its bytes evenly over every device of the mesh (`[devices, B]` uint8, one row block each); per
wave, one `all_to_all` sends each device's block of host h's job to h's devices (split over them), so each
host receives exactly the bytes of its own job and sends 1/devices of every job. Host memory per wave:
about three of its jobs' size (blocks in, packed, received), whatever the model size.

jax.device_put cannot move a non-addressable array onto one host (multi-controller JAX refuses a
reshard to another device set), and `process_allgather` puts each array on every host: hence this.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Hashable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxpod.io import safetensors_io
from jaxpod.runtime import progress


@dataclasses.dataclass(frozen=True)
class Job:
  """One array to deliver whole to one host."""

  array: jax.Array  # a global array over the mesh, any sharding
  owner: int  # process index that receives convert(array)
  convert: Callable  # jittable array -> array to deliver (layout, dtype); its leading dim counts rows
  key: Hashable  # names `convert` (with the array's shape and sharding it keys the compiled call)


def hosts_of(mesh) -> list[int]:
  """Process indices owning the mesh's devices, ascending."""
  return sorted({d.process_index for d in mesh.devices.flat})


def deliver(jobs: list[Job], mesh) -> Iterator[tuple[int, list[np.ndarray]]]:
  """(job index, its bytes as uint8 pieces in row-major order) for every job this host owns, in job order;
  every host of the mesh must call it with the same jobs (collectives)."""
  hosts = hosts_of(mesh)
  me = jax.process_index()
  if len(hosts) == 1:
    for i, job in enumerate(jobs):
      if job.owner == me:
        y = np.ascontiguousarray(jax.device_get(_cached(("convert", job.key), lambda: jax.jit(job.convert))(job.array)))
        safetensors_io.count("gathered", y.nbytes)
        yield i, [y.reshape(-1).view(np.uint8)]
    return
  n, per_host = mesh.devices.size, mesh.devices.size // len(hosts)
  ranks = _local_ranks(mesh, hosts)
  queues = {h: [i for i, j in enumerate(jobs) if j.owner == h] for h in hosts}
  bad = sorted({j.owner for j in jobs} - set(hosts))
  if bad:
    raise ValueError(f"deliver: owner(s) {bad} hold no device of the mesh (its hosts are {hosts})")
  waves = 0
  while any(queues.values()):
    waves += 1
    progress.detail(f"gathering arrays to their writers, wave {waves}")  # where a stuck host was (the watchdog)
    wave = [queues[h].pop(0) if queues[h] else None for h in hosts]
    present = [i for i in wave if i is not None]
    shapes = {i: jax.eval_shape(jobs[i].convert, jobs[i].array) for i in present}
    real = {i: _block_bytes(shapes[i], n) for i in present}
    width = _bucket(max(real.values()), per_host)
    packed = [_packer(jobs[i], n, width, mesh)(jobs[i].array) for i in present]
    by_slot = {i: a for i, a in zip(present, packed)}
    ins = [by_slot[i] if i is not None else packed[0] for i in wave]  # an idle host's slot carries a copy
    got = _exchange(mesh, tuple(ranks), len(hosts), width)(*ins)
    del ins, packed, by_slot
    mine = wave[hosts.index(me)] if me in hosts else None
    if mine is None:
      continue
    local = {ranks[_linear(mesh, s.device)]: np.asarray(s.data) for s in got.addressable_shards}  # rank -> [n, S]
    total = shapes[mine].size * shapes[mine].dtype.itemsize
    safetensors_io.count("gathered", total)
    yield mine, _pieces([local[r] for r in range(per_host)], real[mine], total)


def _pieces(parts: list[np.ndarray], block: int, total: int) -> list[np.ndarray]:
  """The job's bytes from each local device's [n_src, S] received sub-chunks: block src is the concatenation
  over local ranks of row src, of which the first `block` bytes are real; the first `total` bytes overall."""
  out, left = [], total
  for src in range(parts[0].shape[0]):
    need = min(block, left)
    for p in parts:
      if need <= 0:
        break
      piece = p[src, :need]
      out.append(piece)
      need -= piece.size
      left -= piece.size
  return out


def _linear(mesh, device) -> int:
  return int(np.flatnonzero(mesh.devices.reshape(-1) == device)[0])


def _local_ranks(mesh, hosts: list[int]) -> list[int]:
  """For each device in mesh order, its rank among its host's devices (mesh order)."""
  seen = {h: 0 for h in hosts}
  out = []
  for d in mesh.devices.flat:
    out.append(seen[d.process_index])
    seen[d.process_index] += 1
  if len(set(seen.values())) != 1:
    raise ValueError(f"deliver: hosts hold unequal numbers of the mesh's devices ({seen}); use a mesh over every "
                     "device of each host")
  return out


def _block_bytes(shape: jax.ShapeDtypeStruct, n: int) -> int:
  """Bytes of one device's row block: ceil(rows / n) rows."""
  rows = shape.shape[0] if shape.shape else 1
  return -(-rows // n) * (shape.size // max(rows, 1)) * shape.dtype.itemsize


def _bucket(nbytes: int, per_host: int) -> int:
  """Packed width: per_host x (m << k) with 8 <= m < 16 holding nbytes: at most 1/8 padding, few distinct
  widths (so few compiled calls)."""
  need = max(-(-nbytes // per_host), 1)
  shift = max(need.bit_length() - 4, 0)
  return per_host * -(-need // (1 << shift)) * (1 << shift)


_CACHE: dict = {}


def _cached(key, make):
  """One compiled callable per key (a job's `convert` is a new object each time; its key is stable)."""
  if key not in _CACHE:
    _CACHE[key] = make()
  return _CACHE[key]


def _packer(job: Job, n: int, width: int, mesh):
  """jit: array -> convert -> rows padded to a multiple of n -> [n, width] uint8, one row block per device."""
  return _cached(("pack", job.key, n, width, mesh), lambda: _make_packer(job.convert, n, width, mesh))


def _make_packer(convert, n: int, width: int, mesh):

  def pack(x):
    y = convert(x)
    rows = y.shape[0] if y.ndim else 1
    y = y.reshape(rows, -1)
    y = jnp.pad(y, ((0, -rows % n), (0, 0)))
    u8 = jax.lax.bitcast_convert_type(y, jnp.uint8).reshape(n, -1)
    return jnp.pad(u8, ((0, 0), (0, width - u8.shape[1])))

  return jax.jit(pack, out_shardings=NamedSharding(mesh, P(mesh.axis_names)))


@functools.lru_cache(maxsize=None)
def _exchange(mesh, ranks: tuple[int, ...], n_hosts: int, width: int):
  """jit over the mesh: slot h's [n, width] blocks -> each device of host h gets [n_src, width / per_host]:
  from every device, its block of slot h's array, the sub-chunk of this device's local rank."""
  axes = mesh.axis_names
  hosts = hosts_of(mesh)
  owner = [hosts.index(d.process_index) for d in mesh.devices.flat]
  per_host = mesh.devices.size // n_hosts
  sub = width // per_host

  def body(*blocks):  # each [1, width]: this device's block of each slot's array
    send = jnp.stack([blocks[owner[d]][0, ranks[d] * sub:(ranks[d] + 1) * sub] for d in range(len(owner))])
    return jax.lax.all_to_all(send, axes, 0, 0, tiled=True)

  spec = P(axes)
  return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(spec,) * n_hosts, out_specs=spec))

