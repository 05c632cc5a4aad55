"""The trainer's hooks: eval, checkpoint, tracker, progress; the interface `Hook`/`StepInfo` is `jaxpod.runtime.hooks`.

Rules every hook follows are in that module's docstring. The trainer finds these by type
(`find_hook(hooks, EvalHook).history`), never by their position in the list.
"""
from __future__ import annotations

from typing import Any, Callable

from jaxpod.runtime.hooks import Hook, Listener, StepInfo, find_hook, run_hooks  # noqa: F401 - re-exported
from jaxpod.runtime.log import get_logger

log = get_logger("train.hooks")


class EvalHook(Hook):
  """Full test-set evaluation (the task's evaluator) with the EMA weights; returns `eval/*` metrics."""

  def __init__(self, evaluator: Callable[[Any, Any], dict], every: int, headline: str | None = None,
               at_start: bool = False):
    self.evaluator, self.every, self.headline = evaluator, every, headline  # headline: the metric logged first
    self.at_start = at_start  # also evaluate the starting weights of a fresh run (step 0; not on resume)
    self.history: list[tuple[int, dict]] = []

  def on_start(self, info: StepInfo) -> dict | None:
    return self(info) if self.at_start and info.step == 0 else None

  def __call__(self, info: StepInfo) -> dict:
    results = self.evaluator(info.state.eval_params, info.state.buffers)
    self.history.append((info.step, results))
    if self.headline in results:
      log.info("eval at step %d: %s %.4f over %d examples", info.step, self.headline, results[self.headline],
               results.get("count", 0))
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


class TrackerHook(Listener):
  """Training metrics every `log_every` steps (and the last), every due hook's results, to a `Tracker`."""

  def __init__(self, tracker, log_every: int, last_step: int):
    self.tracker, self.log_every, self.last_step = tracker, max(log_every, 1), last_step

  def on_metrics(self, step: int, metrics: dict) -> None:
    if step % self.log_every == 0 or step == self.last_step:
      self.tracker.log(step, metrics)

  def on_results(self, step: int, results: dict) -> None:
    self.tracker.log(step, results)

  def close(self) -> None:
    self.tracker.close()


class ProgressHook(Listener):
  """The leader's progress bar (`progress.ProgressDisplay`); records the time to the first finished step."""

  def __init__(self, display):
    self.display = display

  def on_metrics(self, step: int, metrics: dict) -> None:
    self.display.first_step_done()
    self.display.update(step, metrics)

  def close(self) -> None:
    self.display.close()
