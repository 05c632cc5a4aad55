"""The trainer's hooks (eval, checkpoint); the interface `Hook`/`StepInfo` is `jaxpod.runtime.hooks`.

Rules every hook follows are in that module's docstring.
"""
from __future__ import annotations

from typing import Any, Callable

from jaxpod.runtime.hooks import Hook, StepInfo, run_hooks  # noqa: F401 - the interface, re-exported
from jaxpod.runtime.log import get_logger

log = get_logger("train.hooks")


class EvalHook(Hook):
  """Full test-set evaluation (the task's evaluator) with the EMA weights; returns `eval/*` metrics."""

  def __init__(self, evaluator: Callable[[Any, Any], dict], every: int):
    self.evaluator, self.every = evaluator, every
    self.history: list[tuple[int, dict]] = []

  def __call__(self, info: StepInfo) -> dict:
    results = self.evaluator(info.state.ema_params, info.state.buffers)
    self.history.append((info.step, results))
    if "exact_accuracy" in results:
      log.info("eval at step %d: exact accuracy %.4f over %d puzzles", info.step, results["exact_accuracy"],
               results["count"])
    else:
      log.info("eval at step %d: %s", info.step, {k: round(v, 4) for k, v in results.items()})
    return {f"eval/{k}": v for k, v in results.items()}


class CheckpointHook(Hook):
  """Saves the train state and the data-iterator state through a `jaxpod.io.Checkpointer`."""

  def __init__(self, checkpointer, every: int, to_tree: Callable[[Any], Any],
               before_save: Callable[..., None] | None = None):
    self.checkpointer, self.every, self.to_tree = checkpointer, every, to_tree
    self.before_save = before_save  # e.g. push staged metrics to the bucket so they match the checkpoint
    self.saved: list[int] = []

  def __call__(self, info: StepInfo) -> None:
    if info.step in self.saved:
      return None
    if self.before_save is not None:
      self.before_save(force=True)
    data_state = info.extras["data_state"]()
    self.checkpointer.save(info.step, self.to_tree(info.state), data_state)
    self.saved.append(info.step)
    return None

  def close(self) -> None:
    self.checkpointer.close()
