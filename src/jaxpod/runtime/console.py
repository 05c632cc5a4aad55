"""Console output: one progress bar and one table printer for every workload (rich).

`Bar` is a rich progress bar on a terminal; when the stream is not a terminal (a log file,
`jaxpod launch`'s pipes, CI) it prints one plain line every `plain_every_s` seconds and a
last one at close, so a log shows progress instead of nothing. Only the leader shows a bar:
pass `enabled=False` elsewhere.
"""
from __future__ import annotations

import time
from typing import Any, Sequence, TextIO


def _console(stream: TextIO | None = None):
  """A rich Console on `stream` (None: stdout); 160 columns when it is not a terminal (a log, a pipe), where
  rich's default 80 would cut a wide table's cells to `…` and lose the figures (COLUMNS still wins)."""
  import os
  from rich.console import Console
  console = Console(file=stream)
  if not console.is_terminal and "COLUMNS" not in os.environ:
    console = Console(file=stream, width=160)
  return console


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], header: bool = True,
          numbers: bool = True):
  """A rich Table: first column left-aligned, the others right (left if not `numbers`); floats with 3 decimals."""
  from rich.table import Table
  t = Table(title=title, show_header=header)
  for i, c in enumerate(columns):
    justify = "left" if i == 0 or not numbers else "right"
    t.add_column(c, justify=justify, style="bold" if i == 0 and not header else None)
  for r in rows:
    t.add_row(*[f"{x:.3f}" if isinstance(x, float) else str(x) for x in r])
  return t


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], header: bool = True,
                numbers: bool = True, stream: TextIO | None = None) -> None:
  """Print `table(...)` to `stream` (default stdout)."""
  _console(stream).print(table(title, columns, rows, header, numbers))


def _duration(seconds: float) -> str:
  s = int(seconds)
  return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class Bar:
  """Progress over `total` units with named text fields (e.g. loss), shown as `<template with value>`.

  fields: (name, template) pairs; the template holds one `{}` for the value, e.g. ("loss", "loss {}").
  Values are strings formatted by the caller; "-" until first set.
  """

  def __init__(self, label: str, total: int, completed: int = 0, fields: Sequence[tuple[str, str]] = (),
               enabled: bool = True, stream: TextIO | None = None, plain_every_s: float = 30.0):
    import sys
    self.label, self.total, self.completed, self.enabled = label, total, completed, enabled
    self.templates = dict(fields)
    self.values = {k: "-" for k in self.templates}
    self.stream = stream if stream is not None else sys.stderr
    self.plain_every_s = plain_every_s
    self._t0 = self._last_plain = time.monotonic()
    self._start = completed
    self._rich = None
    if enabled and self.stream.isatty():
      self._start_rich()

  def _start_rich(self) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
    cols = [TextColumn(f"[bold]{self.label}"), BarColumn(), MofNCompleteColumn()]
    cols += [TextColumn(t.replace("{}", "{task.fields[%s]}" % k)) for k, t in self.templates.items()]
    self._rich = Progress(*cols, TimeRemainingColumn(), console=_console(self.stream), refresh_per_second=4)
    self._task = self._rich.add_task(self.label, total=self.total, completed=self.completed, **self.values)
    self._rich.start()

  @property
  def console(self):
    """The rich Console the bar writes to (for a summary printed after it)."""
    return self._rich.console if self._rich is not None else _console(self.stream)

  def update(self, completed: int | None = None, advance: int = 0, **values: str) -> None:
    """Set or advance the count and any field values; a plain line when one is due."""
    if not self.enabled:
      return
    self.completed = (self.completed if completed is None else completed) + advance
    self.values.update(values)
    if self._rich is not None:
      self._rich.update(self._task, completed=self.completed, **values)
    elif time.monotonic() - self._last_plain >= self.plain_every_s:
      self._plain()

  def plain_line(self) -> str:
    """`label 40/100 (40%) loss 0.1234 ... 0:12 elapsed, eta 0:18`."""
    pct = 100 * self.completed / self.total if self.total else 100.0
    elapsed = time.monotonic() - self._t0
    done = self.completed - self._start
    eta = _duration(elapsed / done * (self.total - self.completed)) if done > 0 else "?"
    fields = " ".join(t.format(self.values[k]) for k, t in self.templates.items())
    return f"{self.label} {self.completed}/{self.total} ({pct:.0f}%) {fields} {_duration(elapsed)} elapsed, eta {eta}"

  def _plain(self) -> None:
    self._last_plain = time.monotonic()
    print(" ".join(self.plain_line().split()), file=self.stream, flush=True)

  def close(self) -> None:
    """Stop the bar (a last plain line when not on a terminal)."""
    if not self.enabled:
      return
    if self._rich is not None:
      self._rich.stop()
      self._rich = None
    else:
      self._plain()
    self.enabled = False

