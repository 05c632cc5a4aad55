"""Progress marks: the main thread says where it is; the watchdog (`runtime/watchdog.py`) reads them.

    progress.mark("train step 12")            # a new phase (a step, a hook, an export wave): progress
    progress.touch()                          # progress inside the phase (an engine round, a queue poll)
    progress.detail("wave 3")                 # progress inside the phase, named: "train step 12, wave 3"
    with progress.allow(3600):                # this block may take up to an hour without marks
      prepare_dataset()

Marks are two assignments and a thread check, cheap enough for every decode round. Only the thread that
armed the watchdog (the one that called `runtime.init`) counts: a helper thread that keeps working while the
main thread is stuck is not progress. A mark made with `step=True` also measures the step time (the interval
since the previous step mark) that the default stall limit scales with. Imports nothing: every layer may mark.
"""
from __future__ import annotations

import contextlib
import dataclasses
import threading
import time


@dataclasses.dataclass
class Progress:
  """The main thread's latest progress, written by it and read by the watchdog thread."""

  owner: int | None = None  # thread ident whose marks count (None: not armed, marks are ignored)
  last: float = 0.0  # time.monotonic() of the latest progress
  phase: str = "start-up"  # what the main thread is doing (the latest mark, and the latest detail after it)
  base: str = "start-up"  # the latest mark alone
  allowances: tuple[float, ...] = ()  # limits of the `allow` blocks the main thread is in
  last_step: float | None = None  # time of the latest step mark
  longest_step_s: float = 0.0  # longest interval between step marks (intervals holding a compile left out)
  compiled: bool = False  # a compile ended since the latest step mark


STATE = Progress()


def arm(owner: int | None = None) -> None:
  """Count marks from thread `owner` (default: this thread) from now on."""
  STATE.owner = threading.get_ident() if owner is None else owner
  STATE.last, STATE.phase, STATE.base, STATE.allowances = time.monotonic(), "start-up", "start-up", ()
  STATE.last_step, STATE.longest_step_s, STATE.compiled = None, 0.0, False


def disarm() -> None:
  STATE.owner = None


def _mine() -> bool:
  return STATE.owner is not None and threading.get_ident() == STATE.owner


def mark(phase: str, step: bool = False) -> None:
  """The main thread starts `phase` (e.g. "train step 12"); `step`: a loop iteration whose interval is the step
  time the default stall limit scales with."""
  if not _mine():
    return
  now = time.monotonic()
  if step:
    if STATE.last_step is not None and not STATE.compiled:
      STATE.longest_step_s = max(STATE.longest_step_s, now - STATE.last_step)
    STATE.last_step, STATE.compiled = now, False
  STATE.last, STATE.phase, STATE.base = now, phase, phase


def detail(what: str) -> None:
  """Progress inside the current phase, named after it (a wave of an export: "HFExportHook at step 40, wave 3")."""
  if _mine():
    STATE.last, STATE.phase = time.monotonic(), f"{STATE.base}, {what}"


def touch() -> None:
  """Progress inside the current phase (a decode round, a poll of a queue that is filling)."""
  if _mine():
    STATE.last = time.monotonic()


def compile_ended() -> None:
  """A trace, lowering or XLA compile ended on the main thread: progress, and the step interval holding it is
  not a step time (the watchdog calls this from JAX's compile events)."""
  if _mine():
    STATE.last, STATE.compiled = time.monotonic(), True


@contextlib.contextmanager
def allow(limit_s: float | None):
  """Inside the block the main thread may go `limit_s` seconds without progress (a control-plane call with its
  own deadline, a dataset the leader prepares for an hour); None: no change."""
  if limit_s is None or not _mine():
    yield
    return
  STATE.allowances = (*STATE.allowances, float(limit_s))
  try:
    yield
  finally:
    STATE.allowances = STATE.allowances[:-1]
