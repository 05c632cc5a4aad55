"""Pod shapes: hosts, devices per host, HBM per device, host RAM per host; presets for the common ones.

    PodShape.named("v5p-64")      # 8 hosts x 4 chips, 95 GB HBM each, ~400 GB host RAM
    PodShape.named("v5e-256")     # 64 hosts x 4 chips, 16 GB HBM each
    PodShape.named("h100x8")      # one GPU node: 8 x H100 80 GB

TPU names follow Cloud TPU's: v4-N and v5p-N count TensorCores (2 per chip, 4 chips per host),
v5e-N / v6e-N count chips (4 per host in multi-host slices, 8 in a single-host v5e-8 / v6e-8).
Sizes are decimal GB (1e9 bytes), as the vendors quote them.
"""
from __future__ import annotations

import dataclasses
import re

GB = 1e9

# family: (TensorCores per chip, chips per host, HBM GB per chip, host RAM GB per host)
_TPU = {"v4": (2, 4, 32.0, 400.0), "v5p": (2, 4, 95.0, 400.0), "v5e": (1, 4, 16.0, 192.0),
        "v6e": (1, 4, 32.0, 720.0)}
_GPU = {"h100x8": (1, 8, 80.0, 1800.0), "h200x8": (1, 8, 141.0, 1800.0), "a100x8": (1, 8, 80.0, 1300.0)}


@dataclasses.dataclass(frozen=True)
class PodShape:
  """The machines a plan is for (sizes in decimal GB)."""

  name: str = "custom"  # label shown in the table (a preset's name)
  hosts: int = 1  # processes, one per host
  devices_per_host: int = 1  # accelerators (chips, GPUs) per host
  hbm_gb: float = 16.0  # accelerator memory per device, GB
  host_ram_gb: float = 100.0  # host RAM per host, GB

  def __post_init__(self):
    for name in ("hosts", "devices_per_host"):
      if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
        raise ValueError(f"pod.{name}={getattr(self, name)!r}: expected a positive integer")
    for name in ("hbm_gb", "host_ram_gb"):
      if not getattr(self, name) > 0:
        raise ValueError(f"pod.{name}={getattr(self, name)!r}: expected a positive size in GB")

  @property
  def devices(self) -> int:
    """Devices in the whole pod."""
    return self.hosts * self.devices_per_host

  @property
  def platform(self) -> str:
    """tpu | gpu for a preset's accelerators (a changed preset keeps its kind); "" for a custom shape."""
    key = self.name.split(" ")[0]
    if key in _GPU:
      return "gpu"
    return "tpu" if re.fullmatch(r"(v4|v5p|v5e|v6e)-\d+", key) else ""

  @classmethod
  def named(cls, name: str) -> "PodShape":
    """A preset: v4-N, v5p-N, v5e-N, v6e-N (Cloud TPU names) or h100x8 / h200x8 / a100x8 (one GPU node)."""
    key = name.strip().lower().replace("v5litepod", "v5e").replace("_", "-")
    if key in _GPU:
      _, per_host, hbm, ram = _GPU[key]
      return cls(name=key, hosts=1, devices_per_host=per_host, hbm_gb=hbm, host_ram_gb=ram)
    m = re.fullmatch(r"(v4|v5p|v5e|v6e)-(\d+)", key)
    if m is None:
      raise ValueError(f"pod={name!r} is not a known shape; use one of {', '.join(PRESETS)} (or v4-N, v5p-N, "
                       "v5e-N, v6e-N), or give --hosts, --devices_per_host, --hbm_gb and --host_ram_gb")
    family, n = m.group(1), int(m.group(2))
    cores, per_host, hbm, ram = _TPU[family]
    chips = n // cores
    if n % cores or chips < 1:
      raise ValueError(f"pod={name!r}: {family} sizes count {cores} cores per chip; use a multiple of {cores}")
    if chips <= 8 and family in ("v5e", "v6e"):
      per_host = chips  # single-host slices: all chips on one host
    elif chips < per_host:
      per_host = chips
    if chips % per_host:
      raise ValueError(f"pod={name!r}: {chips} chips is not a whole number of {per_host}-chip hosts")
    return cls(name=key, hosts=chips // per_host, devices_per_host=per_host, hbm_gb=hbm, host_ram_gb=ram)


PRESETS = ("v5p-8", "v5p-64", "v5p-128", "v5p-256", "v5e-8", "v5e-256", "v6e-256", "v4-64", "h100x8", "h200x8",
           "a100x8")
