"""`PublishWeightsHook(every=N)`: publish the trainer's params every N steps.

It subclasses the one hook interface (`jaxpod.runtime.hooks.Hook`: attribute `every`, `due(step, final)`,
`__call__(info: StepInfo)`, `close()`), which lives below every workload, so train/ and transfer/ stay
siblings that never import each other. Outside the trainer it can be called directly as `hook(step, params)`.
`select=adapters_of` publishes LoRA adapters alone. Every host calls it (publish is collective on a multi-host
trainer); the weight id is the step. The trainer's state is donated to its next
step: transports that keep serving from memory hold numpy views of the published buffers, which
JAX then does not donate (the step writes new buffers; see `flatten._host`).

With `background=True` (default: the server's `transfer.background`) the hook snapshots the params on device, uploads them in a thread while the
trainer runs its next steps, and commits version k at its next call (or at `close`): the step never
waits for the bytes, and version k becomes visible to workers one publish later (a policy lag of
one more step, which RL's `max_policy_lag` must allow).
"""
from __future__ import annotations

import time
from typing import Any, Callable

from jaxpod.runtime.hooks import Hook
from jaxpod.transfer.config import TransferConfig


def _params_of(state: Any) -> Any:
  return state.params


def adapters_of(state: Any) -> Any:
  """`select` for adapter-only publishing: the `nnx.LoRAParam` leaves of `state.params` (LoRA adapters), nothing
  of the frozen base; a trainer whose params are the adapters already (`jaxpod rl --lora.rank N`) needs none."""
  from flax import nnx
  return nnx.filter_state(state.params, nnx.LoRAParam)


class PublishWeightsHook(Hook):
  """Publishes `select(info.state)` as weight id `info.step` when due (and at the final step)."""

  def __init__(self, config_or_server: Any, every: int, select: Callable[[Any], Any] = _params_of,
               publish_final: bool = True, background: bool | None = None):
    if every < 1:
      raise ValueError(f"PublishWeightsHook.every={every} must be >= 1")
    if isinstance(config_or_server, TransferConfig):
      from jaxpod.transfer.api import create_server
      config_or_server = create_server(config_or_server)
    self.server, self.every, self.select, self.publish_final = config_or_server, every, select, publish_final
    if background is None:  # the server's transfer config decides
      background = getattr(getattr(self.server, "config", None), "background", False)
    self.background = background
    self.pending = None  # background: the version being uploaded, committed at the next call or close
    self.last_published: int | None = None
    self.history: list[dict] = []  # per publish: the transfer metrics

  def due(self, step: int, final: bool = False) -> bool:
    """Whether the trainer should call the hook at this step."""
    return (final and self.publish_final) or step % self.every == 0

  def __call__(self, info_or_step: Any, params: Any = None, force: bool = False) -> dict | None:
    """Trainer: `hook(info)` (already due). Plain loops: `hook(step, params)` (publishes if due).

    Returns `transfer/*` metrics for the trainer's tracker, or None when nothing was published."""
    if params is None and hasattr(info_or_step, "state"):
      step, params = int(info_or_step.step), self.select(info_or_step.state)
    else:
      step = int(info_or_step)
      if not (force or self.due(step)):
        return None
    if step == self.last_published:
      return None
    if not self.background:
      self.last_published = step
      return self._summary(self.server.publish(step, params))
    out = self.commit_pending()
    self.pending = self.server.publish_in_background(step, params)
    self.last_published = step
    return out

  def commit_pending(self) -> dict | None:
    """Background mode: wait for the version in flight to upload and commit it (every host calls this)."""
    if self.pending is None:
      return None
    pending, self.pending = self.pending, None
    t0 = time.perf_counter()
    out = self._summary(pending.result())
    out["transfer/publish_wait_s"] = time.perf_counter() - t0  # what the trainer waited for
    return out

  def _summary(self, metrics: Any) -> dict | None:
    if metrics is None:
      return None
    summary = metrics.as_dict()
    self.history.append(summary)
    return {"transfer/publish_s": summary["seconds"], "transfer/publish_mb_per_s": summary["mb_per_s"]}

  def close(self) -> None:
    """Commit the version in flight, then stop the server the hook owns."""
    try:
      self.commit_pending()
    finally:
      self.server.close()
