"""Console output on the leader: a rich progress bar while training, a summary table at the end.

The bar shows step, loss, exact accuracy of the halted rows, steps/s and ETA. The summary
adds what a user checks after a run: final eval, time to first step (compile included), wall
time and the persistent compile cache's hits and misses. Non-leaders print nothing.
"""
from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table


class ProgressDisplay:
  """A rich progress bar (leader only, `enabled=False` elsewhere)."""

  def __init__(self, total: int, start: int, enabled: bool, console: Console | None = None,
               start_time: float | None = None):
    self.enabled = enabled
    self.console = console or Console(stderr=True)
    self.start_time = time.monotonic() if start_time is None else start_time  # time to first step counts from here
    self.first_step_s: float | None = None
    self._start_step = start
    self._progress = None
    if not enabled:
      return
    self._progress = Progress(
        TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"), TextColumn("acc {task.fields[acc]}"),
        TextColumn("{task.fields[rate]} steps/s"), TimeRemainingColumn(), console=self.console,
        transient=False, refresh_per_second=4)
    self._task = self._progress.add_task("train", total=total, completed=start, loss="-", acc="-", rate="-")
    self._progress.start()

  def first_step_done(self) -> None:
    """Record the time from start to the first finished step (compilation included)."""
    if self.first_step_s is None:
      self.first_step_s = time.monotonic() - self.start_time
      self._rate_t0, self._rate_step0 = time.monotonic(), None

  def update(self, step: int, metrics: dict | None) -> None:
    if self._progress is None:
      return
    fields = {}
    if metrics and "loss" in metrics:
      fields["loss"] = f"{metrics['loss']:.4f}"
    if metrics and "exact_accuracy" in metrics:  # absent on steps where no row halted
      fields["acc"] = f"{metrics['exact_accuracy']:.3f}"
    if self.first_step_s is not None:
      if self._rate_step0 is None:
        self._rate_t0, self._rate_step0 = time.monotonic(), step
      elif step > self._rate_step0:
        fields["rate"] = f"{(step - self._rate_step0) / (time.monotonic() - self._rate_t0):.1f}"
    self._progress.update(self._task, completed=step, **fields)

  def close(self) -> None:
    if self._progress is not None:
      self._progress.stop()
      self._progress = None


def summary_table(rows: list[tuple[str, str]]) -> Table:
  """A two-column table of (name, value)."""
  table = Table(title="jaxpod train: summary", show_header=False)
  table.add_column("what", style="bold")
  table.add_column("value")
  for name, value in rows:
    table.add_row(name, value)
  return table


def print_summary(console: Console, rows: list[tuple[str, str]]) -> None:
  console.print(summary_table(rows))
