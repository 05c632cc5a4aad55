"""Console output on the leader: a progress bar while training, a summary table at the end.

The bar (`jaxpod.runtime.console.Bar`: rich on a terminal, a plain line every 30 s in a log)
shows step, the task's `bar_metrics` (TRM: loss and exact accuracy of the halted rows), steps/s and ETA. The summary adds what a
user checks after a run: final eval, time to first step (compile included), wall time and the
persistent compile cache's hits and misses. Non-leaders print nothing.
"""
from __future__ import annotations

import time

from jaxpod.runtime import console as console_lib

RATE = ("rate", "{} steps/s")


class ProgressDisplay:
  """The training bar (leader only, `enabled=False` elsewhere)."""

  def __init__(self, total: int, start: int, enabled: bool, console=None, start_time: float | None = None,
               metrics: tuple[str, ...] = ("loss",)):
    self.enabled, self.metrics = enabled, tuple(metrics)
    self.start_time = time.monotonic() if start_time is None else start_time  # time to first step counts from here
    self.first_step_s: float | None = None
    fields = [(m, f"{m.rpartition('/')[2]} {{}}") for m in self.metrics] + [RATE]
    self._bar = console_lib.Bar("train", total, start, fields, enabled=enabled)
    self.console = console or self._bar.console

  def first_step_done(self) -> None:
    """Record the time from start to the first finished step (compilation included)."""
    if self.first_step_s is None:
      self.first_step_s = time.monotonic() - self.start_time
      self._rate_t0, self._rate_step0 = time.monotonic(), None

  def update(self, step: int, metrics: dict | None) -> None:
    if not self.enabled:
      return
    fields = {}
    for name in self.metrics:  # a metric may be absent on some steps (TRM: no row halted)
      if metrics and isinstance(metrics.get(name), (int, float)):
        fields[name] = f"{metrics[name]:.4f}"
    if self.first_step_s is not None:
      if self._rate_step0 is None:
        self._rate_t0, self._rate_step0 = time.monotonic(), step
      elif step > self._rate_step0:
        fields["rate"] = f"{(step - self._rate_step0) / (time.monotonic() - self._rate_t0):.1f}"
    self._bar.update(completed=step, **fields)

  def close(self) -> None:
    self._bar.close()


def print_summary(console, rows: list[tuple[str, str]]) -> None:
  """The end-of-run summary: a two-column table of (name, value)."""
  console.print(console_lib.table("jaxpod train: summary", ("what", "value"), rows, header=False, numbers=False))
