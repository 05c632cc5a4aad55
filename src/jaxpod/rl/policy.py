"""The policy: what it is (`PolicySpec`) and what every RL job builds from it.

`PolicySpec` names the architecture and where the weights start; from it come the tokenizer, the
Llama config and the stop ids, the same in the trainer, the rollout workers and the checks.
`PolicyTask` is what the two trainer tasks (`train_tasks.py`) share: the Llama policy, its optimizer
shape and the held-out accuracy evaluator (`Accuracy`); building, loading and the HF export at the end are every
Llama task's (`jaxpod.models.llama.training.LlamaTask`).
`check_same_problems` is the setup check every job of a run makes on the problems its hosts read.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from jaxpod.models.llama.config import LlamaConfig
from jaxpod.models.llama.lora import LoraConfig
from jaxpod.models.llama.tokenizer import Tokenizer
from jaxpod.models.llama.training import LlamaTask
from jaxpod.problems.base import ProblemSet
from jaxpod.problems.rewards import VerifiedProblems
from jaxpod.rl.config import RLModelConfig, RolloutConfig
from jaxpod.train.config import TrainConfig


@dataclasses.dataclass(frozen=True)
class PolicySpec:
  """The policy's architecture and starting weights."""

  model: RLModelConfig  # the architecture (when start_from is None); model.hf: the tokenizer's checkpoint
  start_from: str | None = None  # HF checkpoint the weights (and config.json) start from; None: random init
  lora: LoraConfig | None = None  # train LoRA adapters on the frozen start_from (rl/adapters.py); None: every weight
  lora_base: str | None = None  # LoRA: the frozen base's HF checkpoint (a worker's start_from may be None: warm-up)

  def tokenizer(self) -> Tokenizer:
    """The HF checkpoint's tokenizer (model.hf), else byte-level."""
    from jaxpod.models.llama.tokenizer import ByteTokenizer, load_tokenizer
    return load_tokenizer(self.model.hf) if self.model.hf else ByteTokenizer()

  def llama(self) -> LlamaConfig:
    """The architecture: the starting checkpoint's config.json if any, else `model`."""
    from jaxpod.models.llama import hf_io
    return hf_io.load_config(self.start_from) if self.start_from else self.model.llama()

  def stop_ids(self, tokenizer: Tokenizer, llama: LlamaConfig) -> tuple[int, ...]:
    """Sampling stops at the tokenizer's and the model's EOS ids."""
    return tuple(sorted(set(tokenizer.eos_ids) | set(llama.eos_token_id)))


class Accuracy:
  """Greedy accuracy on the held-out problems, and pass@k with `eval.k` (the trainer's evaluator); for a multi-turn
  set, the fraction of episodes solved. The one held-out evaluator: the preference default uses it too."""

  def __init__(self, problems: VerifiedProblems, rollout: RolloutConfig, graphdef, mesh, tokenizer, stop_ids,
               weights: Callable | None = None):
    from jaxpod.rl.rollout.episodes import samples_for
    self.weights = weights  # (params, buffers) -> the whole policy's state (LoRA: adapters + base); None: params
    self.rollout, self.graphdef, self.mesh, self.tokenizer, self.stop_ids = rollout, graphdef, mesh, tokenizer, stop_ids
    self.problems = problems.eval_set()
    self.evaluation, self.seed = problems.evaluation, problems.seed
    self.samples = samples_for(problems, rollout.max_prompt_len, rollout.keep_kv)  # one turn, or episodes
    self.sampler = None
    self.sampling = None  # pass@k: the rollout engine's shapes and temperature (its programs are the rollouts')

  def __call__(self, params, buffers) -> dict:
    import time
    from jaxpod.rl.rollout.roller import accuracy, make_sampler, pass_at_k
    t0 = time.perf_counter()
    if self.weights is not None:
      params = self.weights(params, buffers)
    if self.sampler is None:
      self.sampler = make_sampler(self.graphdef, params, self.mesh, self.rollout, self.stop_ids, greedy=True)
    else:
      self.sampler.update_params(params, self.sampler.version + 1)
    out = accuracy(self.sampler, self.tokenizer, self.problems, self.samples)
    ev = self.evaluation
    if ev.k:
      if self.sampling is None:
        self.sampling = make_sampler(self.graphdef, params, self.mesh, self.rollout, self.stop_ids)
      else:
        self.sampling.update_params(params, self.sampling.version + 1)
      out |= pass_at_k(self.sampling, self.tokenizer, self.problems, ev.n, ev.k, self.seed, self.samples)
    return out | {"seconds": time.perf_counter() - t0}


class PolicyTask(LlamaTask):
  """What both trainer tasks share: the Llama policy (built, loaded and exported by `LlamaTask`), its optimizer
  shape, the accuracy evaluator."""

  headline = "accuracy"

  def __init__(self, cfg: TrainConfig, policy: PolicySpec, problems: VerifiedProblems, rollout: RolloutConfig,
               export_to: str | None):
    self.cfg, self.policy, self.problems, self.rollout, self.export_to = cfg, policy, problems, rollout, export_to
    self.tokenizer = policy.tokenizer()
    self.llama = policy.llama()
    self.start_url = policy.start_from  # None: random init
    self.stop_ids = policy.stop_ids(self.tokenizer, self.llama)
    self.row_len = rollout.max_prompt_len + rollout.max_new_tokens  # tokens per training row
    self.host, self.hosts = 0, 1
    self.lora = policy.lora  # None: every weight trained; else the adapters only, the base frozen in the buffers
    self._plain = None  # LoRA: the adapter-free graphdef (GRPO's KL reference runs the base through it)

  def prepare(self) -> dict:
    return {}

  def setup(self, prepared, host_index: int, host_count: int) -> None:
    self.host, self.hosts = host_index, host_count
    check_same_problems(self.problems.problem_set, "trainer")

  def reference(self, graphdef, buffers):
    """(graphdef, weights) of the frozen KL reference: the starting weights' copy, or with LoRA the base with the
    adapters off (the same arrays as the policy's base)."""
    from jaxpod.models.llama.lora import base_graphdef
    from jaxpod.rl.adapters import reference
    if self.lora is not None and self._plain is None:
      self._plain = base_graphdef(self.llama)
    return reference(graphdef, buffers, self.lora, self._plain)

  def _adamw(self, lr: float, warmup: int, weight_decay: float, grad_clip: float):
    import optax
    from jaxpod.models.llama.model import weight_decay_mask
    lr = lr * getattr(self.lora, "lr_scale", 1.0)  # LoRA's rule: a multiple of full fine-tuning's rate
    sched = optax.linear_schedule(0.0, lr, max(warmup, 1)) if warmup else optax.constant_schedule(lr)
    adamw = optax.adamw(sched, b1=0.9, b2=0.99, weight_decay=weight_decay, mask=weight_decay_mask)
    tx = optax.chain(optax.clip_by_global_norm(grad_clip), adamw) if grad_clip else adamw
    from jaxpod.models.llama.lora import scale_b  # LoRA+: B's updates scaled after Adam (B starts at 0)
    return scale_b(tx, getattr(self.lora, "b_lr_ratio", 1.0)), sched

  def evaluator(self, graphdef, mesh, ema_sh, buffer_sh, batch_sh) -> Callable:
    return Accuracy(self.problems, self.rollout, graphdef, mesh, self.tokenizer, self.stop_ids,
                    weights=None if self.lora is None else self.weights)

  def hooks(self, graphdef, mesh, tcfg) -> list:
    if not self.export_to:
      return []
    from jaxpod.rl.adapters import sibling
    return self.export_hooks(graphdef, self.export_to, adapter_url=sibling(self.export_to, "adapter"))

  def eval_summary(self, ev: dict) -> list[tuple[str, str]]:
    return [("held-out accuracy", f"{ev.get('accuracy', float('nan')):.1%} of {ev.get('count', 0)} problems")]

  def local(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """This host's contiguous share of the global rows."""
    from jaxpod.rl.rollout.groups import host_share
    return host_share(arrays, self.host, self.hosts)


def check_same_problems(problem_set: ProblemSet, job: str) -> None:
  """Every host of this job holds the same problems, or a one-line ValueError naming the hosts that differ.

  Hosts refer to problems by (stream, index) and the engine runs the same prompts on every host (invariant 1):
  a prompt file that differs between hosts' disks, or was rewritten between their reads, would have them
  train on different data without any error. One allgather of a digest at setup; nothing when the problems
  are a pure function of the config."""
  from jaxpod.runtime import control, state
  digest = problem_set.fingerprint()
  if not digest or not state.in_multi_process_job():
    return
  seen = control.allgather(digest, f"rl.task.fingerprint.{job}")
  differ = [h for h, d in enumerate(seen) if d != seen[0]]
  if differ:
    source = getattr(problem_set, "path", "the problem set's source")
    raise ValueError(f"rl.task: {job} host(s) {differ} read other problems from {source} than host 0 (digests "
                     f"{seen[differ[0]][:12]} vs {seen[0][:12]}); every host must read the same file: put it in "
                     "the bucket (gs://...) or copy the same version to every host, and do not rewrite it while "
                     "a job starts")
