"""Preemption: a SIGTERM on any host makes every host save the same step and exit with EXIT_PREEMPTED.

Each host's SIGTERM handler only sets a flag (replacing JAX's own preemption notifier). Every
`check_every` steps the hosts exchange their flags through the control plane
(`runtime.allgather`, a few KV-store round trips); if any host was told to stop, all of them save
that step and exit together. With one process the flag is read at every step.

Why not JAX's `multihost_utils.reached_preemption_sync_point`: Orbax's CheckpointManager calls
it too, with the checkpoint's step, from inside `save()`; interleaved with the training loop's
per-step calls, a notice received here was never reported as reached on CPU simulations
(jax 0.10.2, orbax 0.12.8), so the run trained on and was killed at the deadline.
"""
from __future__ import annotations

import signal

from jaxpod import runtime
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
  """`reached(step)` is True at the same step on every host once any host got SIGTERM."""

  def __init__(self, multi_process: bool, check_every: int):
    self._multi, self._every = multi_process, max(check_every, 1)
    self._notice = False
    self._previous = None
    try:
      self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
    except ValueError:  # not the main thread: no handler, no preemption save
      log.warning("training outside the main thread: SIGTERM will not trigger a preemption checkpoint")

  def _on_sigterm(self, signum, frame) -> None:
    self._notice = True
    log.warning("SIGTERM received: every host saves a checkpoint within %d steps, then exits %d", self._every,
                EXIT_PREEMPTED)

  def reached(self, step: int) -> bool:
    if not self._multi:
      return self._notice
    if step % self._every:
      return False
    return any(runtime.allgather(self._notice, "train.preemption"))

  def close(self) -> None:
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
      self._previous = None
