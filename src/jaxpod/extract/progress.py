"""Leader-only progress over samples with tokens/s (`jaxpod.runtime.console.Bar`)."""
from __future__ import annotations

import time

from jaxpod.runtime.console import Bar


class Progress:
  """Samples done and tokens/s; a no-op when disabled (every host but the leader)."""

  def __init__(self, plan, cfg, enabled: bool):
    self.plan, self.batch_size = plan, cfg.batch_size
    done = min(plan.start_batch * cfg.batch_size, plan.num_rows)
    self._bar = Bar("extract", plan.num_rows, done, (("tok_s", "samples {} tok/s"),), enabled=enabled)
    self._t0, self._tokens = time.perf_counter(), 0

  def advance(self, b: int) -> None:
    lo, hi = b * self.batch_size, min((b + 1) * self.batch_size, self.plan.num_rows)
    self._tokens += int(self.plan.lengths[lo:hi].sum())
    rate = self._tokens / max(time.perf_counter() - self._t0, 1e-9)
    self._bar.update(advance=hi - lo, tok_s=f"{rate:>9.0f}")

  def close(self) -> None:
    self._bar.close()
