"""`PolicyTask`: what the trainer tasks of a policy on a problem set share (the warm-up here, RL's GRPO).

The Llama policy of a `PolicySpec` (built, loaded and exported by `LlamaTask`), its AdamW at LoRA's learning-rate
rule, the held-out accuracy evaluator (`Accuracy`) and this host's share of the global rows (`host_share`).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from jaxpod.policy.engine import EngineOptions
from jaxpod.policy.llama_task import LlamaTask
from jaxpod.policy.spec import PolicySpec, check_same_problems
from jaxpod.problems.rewards import VerifiedProblems
from jaxpod.runtime import storage
from jaxpod.train.config import TrainConfig


def host_share(arrays: dict[str, np.ndarray], host: int, hosts: int) -> dict[str, np.ndarray]:
  """Host `host`'s contiguous share of the global rows (of `hosts` equal shares)."""
  rows = next(iter(arrays.values())).shape[0]
  share = rows // hosts
  return {k: v[host * share:(host + 1) * share] for k, v in arrays.items()}


class PolicyTask(LlamaTask):
  """What a policy's trainer tasks share: the Llama policy (built, loaded and exported by `LlamaTask`), its optimizer
  shape, the accuracy evaluator. The policy's tokenizer and architecture are the spec's, read once per run."""

  headline = "accuracy"

  def __init__(self, cfg: TrainConfig, policy: PolicySpec, problems: VerifiedProblems, options: EngineOptions,
               export_to: str | None):
    self.cfg, self.policy, self.problems, self.options, self.export_to = cfg, policy, problems, options, export_to
    self.tokenizer, self.llama, self.stop_ids = policy.tokenizer, policy.llama, policy.stop_ids
    self.start_url = policy.start_from  # None: random init
    self.row_len = options.cache_len  # tokens per training row
    self.host, self.hosts = 0, 1
    self.lora = policy.lora  # None: every weight trained; else the adapters only, the base frozen in the buffers

  def prepare(self) -> dict:
    return {}

  def setup(self, prepared, host_index: int, host_count: int) -> None:
    self.host, self.hosts = host_index, host_count
    check_same_problems(self.problems.problem_set, "trainer")

  def _adamw(self, lr: float, warmup: int, weight_decay: float, grad_clip: float):
    import optax
    from jaxpod.models.llama.model import weight_decay_mask

    def build(peak: float):
      sched = optax.linear_schedule(0.0, peak, max(warmup, 1)) if warmup else optax.constant_schedule(peak)
      adamw = optax.adamw(sched, b1=0.9, b2=0.99, weight_decay=weight_decay, mask=weight_decay_mask)
      return (optax.chain(optax.clip_by_global_norm(grad_clip), adamw) if grad_clip else adamw), sched
    return self.optimizer_for(lr, build)

  def evaluator(self, graphdef, mesh, ema_sh, buffer_sh, batch_sh) -> Callable:
    from jaxpod.policy.evaluate import Accuracy
    return Accuracy(self.problems, self.options, graphdef, mesh, self.tokenizer, self.stop_ids,
                    weights=None if self.lora is None else self.weights)

  def hooks(self, graphdef, mesh, tcfg) -> list:
    if not self.export_to:
      return []
    adapter_url = storage.join(self.export_to.rstrip("/").rsplit("/", 1)[0], "adapter")  # beside the export's hf/
    return self.export_hooks(graphdef, self.export_to, adapter_url=adapter_url)

  def eval_summary(self, ev: dict) -> list[tuple[str, str]]:
    return [("held-out accuracy", f"{ev.get('accuracy', float('nan')):.1%} of {ev.get('count', 0)} problems")]

  def local(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """This host's contiguous share of the global rows."""
    return host_share(arrays, self.host, self.hosts)
