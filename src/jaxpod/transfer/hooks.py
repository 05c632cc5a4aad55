"""`PublishWeightsHook(every=N)`: publish the trainer's params every N steps.

The trainer's hook interface (src/jaxpod/train/) did not exist when this was written, so the
hook is a small callable `hook(step, params)` that any loop can call after each step; adapt
it to the trainer's hook protocol once that lands. Every host calls it (publish is collective
on a multi-host trainer); the weight id is the step.
"""
from __future__ import annotations

from typing import Any

from jaxpod.transfer.config import TransferConfig


class PublishWeightsHook:
  """Calls `server.publish(step, params)` when `step % every == 0` (and on `force`)."""

  def __init__(self, config_or_server: Any, every: int):
    if every < 1:
      raise ValueError(f"PublishWeightsHook.every={every} must be >= 1")
    if isinstance(config_or_server, TransferConfig):
      from jaxpod.transfer.api import create_server
      config_or_server = create_server(config_or_server)
    self.server, self.every = config_or_server, every
    self.last_published: int | None = None

  def __call__(self, step: int, params: Any, force: bool = False):
    """Publish if due; returns the publish metrics or None."""
    if not force and step % self.every:
      return None
    metrics = self.server.publish(step, params)
    self.last_published = step
    return metrics

  def close(self) -> None:
    """Stop the server the hook owns."""
    self.server.close()
