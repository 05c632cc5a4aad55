"""This process's own accounting from /proc (Linux): peak resident memory and bytes written.

Simulated hosts are processes, so a host's share of memory and bytes is measurable here:

    reset_peak()                       # VmHWM := VmRSS
    base = status_bytes("VmRSS")
    ...                                # the phase
    grown = status_bytes("VmHWM") - base
    peak_memory()                      # {"host_peak_rss_bytes": VmHWM, "device_peak_bytes": accelerators only}
"""
from __future__ import annotations


def status_bytes(field: str) -> int:
  """A memory field of /proc/self/status (VmRSS, VmHWM, ...) in bytes."""
  with open("/proc/self/status") as f:
    return int(next(line for line in f if line.startswith(field + ":")).split()[1]) * 1024


def io_bytes(field: str) -> int:
  """A counter of /proc/self/io (rchar, wchar, ...): bytes through read/write-family calls."""
  with open("/proc/self/io") as f:
    return int(next(line for line in f if line.startswith(field + ":")).split()[1])


def reset_peak() -> None:
  """Reset the peak resident memory (VmHWM) to the current resident memory."""
  with open("/proc/self/clear_refs", "w") as f:
    f.write("5")


def peak_memory() -> dict:
  """This process's peak memory so far: resident host memory (VmHWM) and, where the backend reports it (GPU,
  TPU), the largest `peak_bytes_in_use` over its local devices (None on CPU, whose arrays are in VmHWM)."""
  import jax
  peaks = []
  for dev in jax.local_devices():
    try:
      stats = dev.memory_stats() or {}
    except Exception:  # noqa: BLE001 - a backend without memory stats
      stats = {}
    if stats.get("peak_bytes_in_use") is not None:
      peaks.append(int(stats["peak_bytes_in_use"]))
  return {"host_peak_rss_bytes": status_bytes("VmHWM"), "device_peak_bytes": max(peaks) if peaks else None}
