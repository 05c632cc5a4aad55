"""The supervised warm-up of a policy on its problem set (`jaxpod rl`'s, and the preference default's).

    train(warmup_run(trainer, folder, policy, problems, WarmupConfig(), engine, runtime=..., mesh=..., tracker=...))

Rows are BOS + prompt + answer + EOS from the problem set's own generator (stream 1), with the next-token loss on
the answer and EOS only (a multi-turn set: the teacher's whole episode, the loss on its turns, not on the
environment's observations). The warm-up trains every weight of a fresh model (the policy's LoRA and starting
checkpoint are what comes after it), reports held-out greedy accuracy (`eval/accuracy`) and ends by writing the
policy as a HF checkpoint (before the final checkpoint, so a finished run always has its export).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from jaxpod.policy.engine import EngineOptions
from jaxpod.policy.spec import PolicyModelConfig, PolicySpec
from jaxpod.policy.task import PolicyTask
from jaxpod.problems import SortProblems
from jaxpod.problems.rewards import VerifiedProblems
from jaxpod.train.config import DataConfig, TaskConfig, TrainConfig, TrainerConfig

WARMUP_STREAM = 1  # training stream of the warm-up's problems (RL samples stream 2, workers 100 + w)


@dataclasses.dataclass(frozen=True)
class WarmupConfig:
  """Supervised fine-tuning on the problem set's own problems before RL (next-token loss on answer + EOS)."""

  steps: int = 150  # optimizer steps (0: no warm-up; ignored when model.hf is set)
  batch_size: int = 128  # problems per step over all hosts
  lr: float = 1e-3  # peak learning rate (AdamW, linear warm-up over the first 10% of steps, then constant)
  grad_clip: float = 1.0  # global-norm clip (0: none; the preference default's warm-up clips nothing)

  def __post_init__(self):
    if self.steps < 0 or self.batch_size < 1 or self.lr <= 0 or self.grad_clip < 0:
      raise ValueError(f"rl.warmup: steps={self.steps} must be >= 0, batch_size={self.batch_size} >= 1, "
                       f"lr={self.lr} > 0, grad_clip={self.grad_clip} >= 0")


def default_policy() -> PolicySpec:
  """The default architecture, random init (a task config's default)."""
  return PolicySpec(PolicyModelConfig())


def default_problems() -> VerifiedProblems:
  """The sort set, exact match, seed 0 (a task config's default)."""
  return VerifiedProblems(SortProblems(), ("exact_match",), (), 0)


@TaskConfig.register_subclass("policy_warmup")
@dataclasses.dataclass(frozen=True)
class WarmupTaskConfig(TaskConfig):
  """Supervised warm-up of a policy on its problem set (built by `warmup_run`, not by hand)."""

  data: DataConfig = dataclasses.field(default_factory=DataConfig)
  policy: PolicySpec = dataclasses.field(default_factory=default_policy)  # the architecture (random init here)
  problems: VerifiedProblems = dataclasses.field(default_factory=default_problems)  # what is demonstrated and evaluated
  warmup: WarmupConfig = dataclasses.field(default_factory=WarmupConfig)  # steps, batch, lr
  engine: EngineOptions = dataclasses.field(default_factory=EngineOptions)  # row length; the evaluation engine
  export_to: str | None = None  # HF checkpoint written at the end
  bar_metrics: tuple[str, ...] = ("loss",)
  plot_metrics: tuple[str, ...] = ("loss", "accuracy")

  prefix = "warmup"

  def build(self, cfg: TrainConfig) -> "WarmupTask":
    return WarmupTask(cfg, self)


class WarmupIterator:
  """Global batch k = problems k*B..(k+1)*B-1 of stream 1, as rows; this host yields its share."""

  def __init__(self, task: "WarmupTask"):
    self.task, self.k = task, 0

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    b = self.task.warmup.batch_size
    problems = self.task.problems.train_problems(WARMUP_STREAM, self.k * b, b)
    self.k += 1
    return self.task.local(self.task.rows(problems))

  def get_state(self) -> dict:
    return {"batches": self.k}

  def set_state(self, state: dict) -> None:
    self.k = int(state["batches"])


class WarmupTask(PolicyTask):
  """Next-token loss on answer + EOS of the problem set's own problems, every weight of a fresh model trained."""

  name = "warmup"
  loss_normalizer = "tokens"  # a mean over the loss mask's tokens (trainer.microbatches)
  batch_ndims = {"tokens": 2, "loss_mask": 2}

  def __init__(self, cfg: TrainConfig, tc: WarmupTaskConfig):
    super().__init__(cfg, tc.policy, tc.problems, tc.engine, tc.export_to)
    self.start_url, self.lora = None, None  # what the policy starts from and adapts is the warm-up's export
    self.warmup = tc.warmup

  def rows(self, problems) -> dict[str, np.ndarray]:
    """tokens [B, T] and the target-aligned loss mask over the teacher's turns, each with its EOS (a multi-turn
    set's demonstration is a whole episode: the environment's observations between turns get no loss)."""
    from jaxpod.problems.environments import demonstration
    tokens = np.full((len(problems), self.row_len), self.tokenizer.pad_id, np.int32)
    mask = np.zeros((len(problems), self.row_len), np.int32)
    for i, p in enumerate(problems):
      e = demonstration(self.problems.problem_set, self.tokenizer, p, self.stop_ids[0])
      row, start = e.context(), len(e.prompt_ids) - 1  # position t predicts token t+1
      tokens[i, :len(row)] = row
      mask[i, start:len(row) - 1] = e.from_policy
    return {"tokens": tokens, "loss_mask": mask}

  def train_iter(self):
    return WarmupIterator(self)

  def optimizer(self):
    return self._adamw(self.warmup.lr, max(1, self.warmup.steps // 10), 0.0, self.warmup.grad_clip)

  def loss_fn(self, graphdef) -> Callable:
    import jax.numpy as jnp
    from jaxpod.models.llama.loss import token_logps

    def loss(params, buffers, batch, rng, carry):
      tokens = batch["tokens"]
      mask = batch["loss_mask"][:, :-1] > 0
      ce = -token_logps(graphdef, params, tokens[:, :-1], tokens[:, 1:])  # no [B, T, V] logits
      total, count = jnp.sum(jnp.where(mask, ce, 0.0)), jnp.sum(mask).astype(jnp.float32)
      return total / jnp.maximum(count, 1.0), (carry, {"loss_sum": total, "tokens": count})
    return loss

  def normalize(self, raw: dict, global_batch: int) -> dict:
    out = {"loss": raw["loss_sum"] / max(raw["tokens"], 1.0)}
    out.update({k: raw[k] for k in ("lr", "grad_norm") if k in raw})
    return out


def warmup_run(trainer: TrainerConfig, folder: str, policy: PolicySpec, problems: VerifiedProblems,
               warmup: WarmupConfig, engine: EngineOptions, **common) -> TrainConfig:
  """The TrainConfig of a supervised warm-up run in `<folder>/warmup`, exported to `<folder>/warmup/hf` (`jaxpod rl`'s
  and the preference default's); `trainer` gives the seed and the cadences; `common`: runtime, mesh, tracker."""
  from jaxpod.runtime import storage
  trainer = dataclasses.replace(trainer, runs_dir=folder, run_name="warmup", steps=warmup.steps, eval_every=0,
                                eval_at_start=False, checkpoint_every=0)  # a preempted rerun resumes it
  data = DataConfig(global_batch_size=warmup.batch_size, eval_batch_size=warmup.batch_size, seed=trainer.seed)
  task = WarmupTaskConfig(data=data, policy=policy, problems=problems, warmup=warmup, engine=engine,
                          export_to=storage.join(folder, "warmup", "hf"))
  return TrainConfig(task=task, trainer=trainer, **common)
