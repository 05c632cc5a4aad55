"""This process's own accounting from /proc (Linux): peak resident memory and bytes written.

Simulated hosts are processes, so a host's share of memory and bytes is measurable here:

    reset_peak()                       # VmHWM := VmRSS
    base = status_bytes("VmRSS")
    ...                                # the phase
    grown = status_bytes("VmHWM") - base
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
