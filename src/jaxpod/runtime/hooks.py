"""The hook interface: work a loop does every N steps (eval, checkpoint, sampling, weight publishing).

It lives at the bottom (runtime) so that every workload subclasses the same `Hook`: train
runs hooks, sample's `SampleHook` and transfer's `PublishWeightsHook` are hooks, and no
workload imports another for it.

The interface:

    class MyHook(Hook):
      every = 100                          # run when step % every == 0 (0: only at the end)
      def __call__(self, info: StepInfo) -> dict | None:
        ...                                # read info.state (global arrays), info.step, ...
        return {"my/metric": 1.0}          # optional: logged by the tracker at info.step
      def on_start(self, info):            # optional: once, with the first (or restored) state, before step 1
      def on_metrics(self, step, metrics): # optional: every step's host-side training metrics
      def on_results(self, step, results): # optional: what the due hooks returned at a step
      def close(self): ...                 # optional: called once when the run ends

Progress bars and trackers are hooks that only listen (`due` is always False): the loop hands
them each step's metrics as soon as it has read them (one step behind the dispatch, so they
never make the host wait on the device) and the due hooks' results right after those ran.

Rules every hook follows:
- It runs on every host, at the same steps, in the same order (the loop calls hooks in list
  order, right after dispatching the step). Anything collective inside it (a jitted program over
  global arrays, a broadcast, an Orbax save) is then issued identically everywhere (invariant 1).
  Leader-only side effects (files, prints) go through `runtime.is_leader()` inside the hook.
- It must not perturb training (invariant 6): never modify `info.state`, never consume from the
  training data iterator, draw randomness from its own keys. The state passed in is the state
  after `info.step` steps; it is donated to the next step, so copy what you keep
  (`jax.device_get` or a jitted copy) instead of holding references.
- It runs at the final step too (`info.final`), so a run always ends with an eval and a checkpoint.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from jaxpod.runtime import progress


@dataclasses.dataclass
class StepInfo:
  """What a hook sees after step `step` was dispatched."""

  step: int  # optimizer steps taken (the state below is after this many steps)
  state: Any  # TrainState of global jax.Arrays (read only; donated to the next step)
  final: bool  # True at the last step of the run
  run_dir: str  # the run folder (leader writes shared files here)
  mesh: Any  # the device mesh
  metrics: dict | None = None  # the latest host-side training metrics (one step behind)
  extras: dict = dataclasses.field(default_factory=dict)  # trainer-provided helpers (data_state: callable)


class Hook:
  """Base class: `every` steps (and at the final step), the loop calls the hook with a StepInfo."""

  every: int = 0

  def due(self, step: int, final: bool) -> bool:
    return final or (self.every > 0 and step % self.every == 0)

  def __call__(self, info: StepInfo) -> dict | None:  # pragma: no cover - interface
    raise NotImplementedError

  def on_start(self, info: StepInfo) -> dict | None:
    """Once before the first step, with the state the loop starts from (fresh or restored; default: nothing).

    Like `__call__` it runs on every host in list order; what it returns is logged at `info.step`."""
    return None

  def on_metrics(self, step: int, metrics: dict) -> None:
    """The host-side training metrics of `step`, when the loop has read them (default: nothing)."""

  def on_results(self, step: int, results: dict) -> None:
    """What the due hooks returned at `step` (eval/*, sample/*), after they ran (default: nothing)."""

  def close(self) -> None:
    """Called once when the run ends (after the last step's hooks)."""


class Listener(Hook):
  """A hook that is never due: it only receives `on_metrics` / `on_results` (progress bars, trackers)."""

  def due(self, step: int, final: bool) -> bool:
    return False

  def __call__(self, info: StepInfo) -> None:
    return None


def find_hook(hooks, kind: type):
  """The first hook of type `kind` in `hooks` (results are looked up by type, never by position); None if absent."""
  return next((h for h in hooks if isinstance(h, kind)), None)


def run_hooks(hooks: list[Hook], info: StepInfo) -> dict:
  """Call every due hook in order; merge what they return."""
  out: dict = {}
  for hook in hooks:
    if hook.due(info.step, info.final):
      progress.mark(f"{type(hook).__name__} at step {info.step}")  # what a stuck host was in (the watchdog)
      result = hook(info)
      if result:
        out.update(result)
  return out
