"""Device meshes with the axes jaxpod uses everywhere: (data, fsdp, model).

The data axis comes first so that it spans hosts: each host's devices form a contiguous
block of the data axis, which keeps per-host data slices contiguous.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

MESH_AXES = ("data", "fsdp", "model")


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """Mesh axis sizes; exactly one may be -1, meaning 'fill with the remaining devices'."""

  data: int = -1  # data-parallel replicas (spans hosts first)
  fsdp: int = 1  # parameter/optimizer-state sharding (ZeRO-3 style), also splits the batch
  model: int = 1  # tensor parallelism (heads, mlp, vocab)

  def __post_init__(self):
    sizes = self.sizes()
    if sum(1 for s in sizes if s == -1) > 1:
      raise ValueError(f"mesh: at most one axis may be -1 (fill), got data={self.data} fsdp={self.fsdp} "
                       f"model={self.model}")
    for name, s in zip(MESH_AXES, sizes):
      if s == 0 or s < -1:
        raise ValueError(f"mesh.{name}={s} is invalid; use a positive size or -1 to fill")

  def sizes(self) -> tuple[int, int, int]:
    return (self.data, self.fsdp, self.model)

  def resolve(self, num_devices: int) -> tuple[int, int, int]:
    """Concrete (data, fsdp, model) sizes for `num_devices`, or a ValueError saying what fits."""
    sizes = list(self.sizes())
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
      if num_devices % known:
        raise ValueError(
            f"mesh {self._desc()} cannot fill {num_devices} devices: the fixed axes multiply to {known}, "
            f"which does not divide {num_devices}; choose sizes whose product divides {num_devices}")
      sizes[sizes.index(-1)] = num_devices // known
    elif known != num_devices:
      raise ValueError(
          f"mesh {self._desc()} needs {known} devices but {num_devices} are available; "
          f"make data*fsdp*model == {num_devices} or set one axis to -1")
    return tuple(sizes)

  def _desc(self) -> str:
    return f"(data={self.data}, fsdp={self.fsdp}, model={self.model})"

  def data_parallel_size(self, num_devices: int) -> int:
    """How many ways the batch is split: data * fsdp."""
    d, f, _ = self.resolve(num_devices)
    return d * f


def data_parallel(mesh) -> int:
  """How many ways a batch splits over `mesh` (a jax Mesh): data x fsdp (an axis it lacks counts 1)."""
  return mesh.shape.get("data", 1) * mesh.shape.get("fsdp", 1)


def make_mesh(data: int = -1, fsdp: int = 1, model: int = 1, devices=None):
  """A `jax.sharding.Mesh` with axes (data, fsdp, model), auto axis types, data spanning hosts."""
  import jax
  from jax.sharding import AxisType, Mesh

  cfg = MeshConfig(data=data, fsdp=fsdp, model=model)
  devices = list(jax.devices() if devices is None else devices)
  shape = cfg.resolve(len(devices))
  # jax.devices() is ordered by process, so a plain reshape puts hosts along the data axis.
  # On TPU the device order inside a host matters for ICI bandwidth; let mesh_utils choose it.
  if devices[0].platform == "tpu" and devices == list(jax.devices()):
    from jax.experimental import mesh_utils
    grid = mesh_utils.create_device_mesh(shape, devices)
  else:
    grid = np.asarray(devices, dtype=object).reshape(shape)
  return Mesh(grid, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES))


def mesh_from_config(cfg: MeshConfig, devices=None):
  """`make_mesh` from a MeshConfig."""
  return make_mesh(cfg.data, cfg.fsdp, cfg.model, devices=devices)


def describe_mesh(mesh) -> str:
  """`data=4 fsdp=2 model=1 (8 devices, 4 hosts)`."""
  hosts = len({d.process_index for d in mesh.devices.flat})
  axes = " ".join(f"{n}={s}" for n, s in mesh.shape.items())
  return f"{axes} ({mesh.devices.size} devices, {hosts} hosts)"


def device_memory_bytes() -> int:
  """Memory of one local device: the accelerator's limit, or host RAM / local devices on CPU."""
  import os

  import jax
  dev = jax.local_devices()[0]
  stats = dev.memory_stats() if hasattr(dev, "memory_stats") else None
  if stats and stats.get("bytes_limit"):
    return int(stats["bytes_limit"])
  return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // len(jax.local_devices())
