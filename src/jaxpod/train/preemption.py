"""Preemption: a SIGTERM on any host makes every host save at the same step and exit with EXIT_PREEMPTED.

With several hosts this is JAX's preemption sync (`multihost_utils.reached_preemption_sync_point`):
JAX's coordination client turns SIGTERM into a notice to the service, which picks the step after
the largest step any host has reached; every host's check returns True at that step, so all of
them save the same step. It must be called at every step on every host (it is a local flag read
until a notice arrives). With one process jaxpod installs its own SIGTERM handler.
"""
from __future__ import annotations

import signal

from jaxpod.runtime.log import get_logger

log = get_logger("train.preemption")
EXIT_PREEMPTED = 143  # 128 + SIGTERM: schedulers read it as "terminated"; the run saved and a rerun resumes


class Preempted(SystemExit):
  """Raised after the preemption checkpoint is saved; exits the process with EXIT_PREEMPTED."""

  coordinated = True  # every host raises it at the same step: not a failure to publish to the others

  def __init__(self, step: int):
    super().__init__(EXIT_PREEMPTED)
    self.step = step


class PreemptionWatch:
  """`reached(step)` is True at the same step on every host once any host got a preemption notice."""

  def __init__(self, multi_process: bool):
    self._multi = multi_process
    self._notice = False
    self._previous = None
    if not multi_process:
      try:
        self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
      except ValueError:  # not the main thread: no handler, no preemption save
        log.warning("training outside the main thread: SIGTERM will not trigger a preemption checkpoint")

  def _on_sigterm(self, signum, frame) -> None:
    self._notice = True
    log.warning("SIGTERM received: saving a checkpoint at the next step, then exiting (%d)", EXIT_PREEMPTED)

  def reached(self, step: int) -> bool:
    if self._multi:
      from jax.experimental import multihost_utils
      return multihost_utils.reached_preemption_sync_point(step)
    return self._notice

  def close(self) -> None:
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
      self._previous = None
