"""Per-transfer metrics on both sides: bytes, seconds and MB/s per phase, plus running totals."""
from __future__ import annotations

import contextlib
import dataclasses
import time


@dataclasses.dataclass
class TransferMetrics:
  """One publish or one receive: phase name -> seconds, and the bytes moved."""

  side: str  # "server" or "client"
  weight_id: int = -1
  seq: int = -1  # the publication's number on the coordinator (set by publish; see the older-id rule)
  nbytes: int = 0
  num_params: int = 0
  largest_param_bytes: int = 0
  phases: dict[str, float] = dataclasses.field(default_factory=dict)

  @contextlib.contextmanager
  def phase(self, name: str):
    """Time a block under `name` (accumulates when repeated)."""
    t0 = time.perf_counter()
    try:
      yield
    finally:
      self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - t0

  @property
  def seconds(self) -> float:
    return sum(self.phases.values())

  def mb_per_s(self, phase: str | None = None) -> float:
    """MB/s (10^6 bytes) over one phase, or over the whole transfer."""
    s = self.seconds if phase is None else self.phases.get(phase, 0.0)
    return self.nbytes / s / 1e6 if s > 0 else 0.0

  def as_dict(self) -> dict:
    """JSON-able summary, one MB/s figure per phase."""
    return {"side": self.side, "weight_id": self.weight_id, "seq": self.seq, "bytes": self.nbytes,
            "num_params": self.num_params, "largest_param_bytes": self.largest_param_bytes, "seconds": self.seconds,
            "mb_per_s": self.mb_per_s(), "phases": dict(self.phases),
            "phase_mb_per_s": {k: self.mb_per_s(k) for k in self.phases}}


@dataclasses.dataclass
class Totals:
  """Running counters over a server's or client's life."""

  transfers: int = 0
  ok: int = 0
  failed: int = 0
  bytes: int = 0
  last: TransferMetrics | None = None

  def record(self, m: TransferMetrics | None, ok: bool) -> None:
    self.transfers += 1
    self.ok += int(ok)
    self.failed += int(not ok)
    if ok and m is not None:
      self.bytes += m.nbytes
      self.last = m

  def as_dict(self) -> dict:
    return {"transfers": self.transfers, "ok": self.ok, "failed": self.failed, "bytes": self.bytes,
            "last": self.last.as_dict() if self.last else None}
