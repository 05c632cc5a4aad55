"""Leader-only progress bar (rich): samples done, tokens/s, ETA."""
from __future__ import annotations

import time


class Progress:
  """A rich progress bar over samples; a no-op when disabled (every host but the leader)."""

  def __init__(self, plan, cfg, enabled: bool):
    self.plan, self.batch_size, self._bar = plan, cfg.batch_size, None
    if not enabled:
      return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, TimeRemainingColumn
    self._bar = RichProgress(TextColumn("extract"), BarColumn(), MofNCompleteColumn(), TextColumn("samples"),
                             TextColumn("{task.fields[tok_s]:>9.0f} tok/s"), TimeRemainingColumn())
    done = min(plan.start_batch * cfg.batch_size, plan.num_rows)
    self._task = self._bar.add_task("extract", total=plan.num_rows, completed=done, tok_s=0.0)
    self._t0, self._tokens = time.perf_counter(), 0
    self._bar.start()

  def advance(self, b: int) -> None:
    if self._bar is None:
      return
    lo, hi = b * self.batch_size, min((b + 1) * self.batch_size, self.plan.num_rows)
    self._tokens += int(self.plan.lengths[lo:hi].sum())
    rate = self._tokens / max(time.perf_counter() - self._t0, 1e-9)
    self._bar.update(self._task, advance=hi - lo, tok_s=rate)

  def close(self) -> None:
    if self._bar is not None:
      self._bar.stop()
