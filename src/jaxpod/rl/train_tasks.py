"""The two tasks `jaxpod rl` gives the one trainer (`jaxpod.train`): supervised warm-up, then GRPO.

Both train the same Llama policy (`policy.PolicyTask`) and report the same held-out metric
(greedy exact-match accuracy, `eval/accuracy`). They differ in data and loss:

  rl_warmup  rows BOS + prompt + answer + EOS from the problem set's own generator (stream 1),
             next-token loss on the answer and EOS only (a multi-turn set: the teacher's whole
             episode, the loss on its turns, not on the environment's observations);
  rl_grpo    rows of rollouts (`rollout.groups.to_batch`) from the batch source it is handed, built
             where the topology is decided (`run.py`): the colocated engine (`colocated.RolloutBuffer`)
             or the rollout queue (`disaggregated.queue_source.QueueSource`); the GRPO loss
             (`grpo.policy_loss`) against the engine's behaviour log-probs, with the trainer's
             log-probs under the engine's sampling distribution (`grpo.policy_logprobs`).

Each task config carries only its own typed slices of `RLConfig` (resolved by `run.py`). Each ends by
writing the policy as a HF checkpoint (before the final checkpoint, so a finished run always has its
export). RL starts from the warm-up's export or `model.hf`.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from jaxpod.problems import SortProblems
from jaxpod.problems.rewards import VerifiedProblems
from jaxpod.rl.config import GRPOConfig, RLModelConfig, RolloutConfig, WarmupConfig
from jaxpod.rl.grpo import correction_metrics
from jaxpod.rl.policy import PolicySpec, PolicyTask
from jaxpod.train.config import DataConfig, TaskConfig, TrainConfig, TrainerConfig

WARMUP_STREAM = 1  # training stream of the warm-up's problems (RL samples stream 2, workers 100 + w)


def _policy() -> PolicySpec:
  return PolicySpec(RLModelConfig())


def _problems() -> VerifiedProblems:
  return VerifiedProblems(SortProblems(), ("exact_match",), (), 0)


# ----------------------------------------------------------------------------- warm-up
@TaskConfig.register_subclass("rl_warmup")
@dataclasses.dataclass(frozen=True)
class WarmupTaskConfig(TaskConfig):
  """Supervised warm-up of an RL policy on its problem set (built by `jaxpod rl`, not by hand)."""

  data: DataConfig = dataclasses.field(default_factory=DataConfig)
  policy: PolicySpec = dataclasses.field(default_factory=_policy)  # the architecture (random init here)
  problems: VerifiedProblems = dataclasses.field(default_factory=_problems)  # what is demonstrated and evaluated
  warmup: WarmupConfig = dataclasses.field(default_factory=WarmupConfig)  # steps, batch, lr
  rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)  # row length; the evaluation engine
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
  """Next-token loss on answer + EOS of the problem set's own problems."""

  name = "warmup"
  loss_normalizer = "tokens"  # a mean over the loss mask's tokens
  batch_ndims = {"tokens": 2, "loss_mask": 2}

  def __init__(self, cfg: TrainConfig, tc: WarmupTaskConfig):
    super().__init__(cfg, tc.policy, tc.problems, tc.rollout, tc.export_to)
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
               warmup: WarmupConfig, rollout: RolloutConfig, **common) -> TrainConfig:
  """The TrainConfig of a supervised warm-up run in `<folder>/warmup`, exported to `<folder>/warmup/hf` (`jaxpod rl`'s
  and the preference default's); `trainer` gives the seed and the cadences; `common`: runtime, mesh, tracker."""
  from jaxpod.runtime import storage
  trainer = dataclasses.replace(trainer, runs_dir=folder, run_name="warmup", steps=warmup.steps, eval_every=0,
                                eval_at_start=False, checkpoint_every=0)  # a preempted rerun resumes it
  data = DataConfig(global_batch_size=warmup.batch_size, eval_batch_size=warmup.batch_size, seed=trainer.seed)
  task = WarmupTaskConfig(data=data, policy=policy, problems=problems, warmup=warmup, rollout=rollout,
                          export_to=storage.join(folder, "warmup", "hf"))
  return TrainConfig(task=task, trainer=trainer, **common)


# ----------------------------------------------------------------------------- GRPO
@TaskConfig.register_subclass("rl_grpo")
@dataclasses.dataclass(frozen=True)
class GRPOTaskConfig(TaskConfig):
  """GRPO on rollouts (built by `jaxpod rl`, not by hand)."""

  data: DataConfig = dataclasses.field(default_factory=DataConfig)
  policy: PolicySpec = dataclasses.field(default_factory=_policy)  # the architecture and starting weights
  problems: VerifiedProblems = dataclasses.field(default_factory=_problems)  # what is sampled, scored and evaluated
  grpo: GRPOConfig = dataclasses.field(default_factory=GRPOConfig)  # the algorithm
  rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)  # the engine's sampling options
  export_to: str | None = None  # HF checkpoint written at the end
  source: Any = None  # the batch source (rollout.groups.BatchSource), built by run.py: colocated.RolloutBuffer | QueueSource
  bar_metrics: tuple[str, ...] = ("reward", "loss")
  plot_metrics: tuple[str, ...] = ("reward", "accuracy")

  prefix = "grpo"

  def build(self, cfg: TrainConfig) -> "GRPOTask":
    return GRPOTask(cfg, self)


class GRPOTask(PolicyTask):
  """The clipped-ratio GRPO loss on the rollout batches of the source it is handed (an iterator of this host's
  rows with `get_state` / `set_state`, and `hooks(graphdef, mesh)`: what keeps it filled)."""

  name = "grpo"
  batch_ndims = {"tokens": 2, "loss_mask": 2, "behaviour": 2, "advantages": 1, "reward": 1, "correct": 1}

  def __init__(self, cfg: TrainConfig, tc: GRPOTaskConfig):
    super().__init__(cfg, tc.policy, tc.problems, tc.rollout, tc.export_to)
    if tc.source is None:
      raise ValueError("rl_grpo: no batch source; jaxpod rl builds one (colocated.RolloutBuffer or QueueSource) "
                       "and passes it as GRPOTaskConfig.source")
    self.grpo, self.source = tc.grpo, tc.source
    # num_iterations: the batch's updates run inside one trainer step (`train.step.repeated`), so a step, a
    # checkpoint, a published policy version and a batch stay one and the same in both topologies: resume, eval_every
    # and max_policy_lag (in batches) mean what they did. The ratio's pi_old stays the engine's behaviour log-probs
    # (TRL's num_iterations), so the clip bounds how far the later updates move from the policy that sampled.
    self.updates_per_batch = tc.grpo.updates_per_batch(lora=tc.policy.lora is not None)
    self.loss_normalizer = "tokens" if tc.grpo.loss_norm == "token" else None  # sequence, constant: over the rows

  def _buffers(self, params) -> dict:
    return {"ref": params} if self.grpo.beta > 0 else {}

  def train_iter(self):
    return self.source

  def optimizer(self):
    g = self.grpo
    return self._adamw(g.lr, 5 * self.updates_per_batch, g.weight_decay, g.grad_clip)  # warm-up: 5 batches' updates

  def loss_fn(self, graphdef) -> Callable:
    import jax
    import jax.numpy as jnp
    from jaxpod.rl.grpo import policy_logprobs, policy_loss
    g, sampling = self.grpo, self.rollout.sampling()  # the distribution the engine drew the tokens from
    max_new_tokens = self.rollout.max_new_tokens

    def loss(params, buffers, batch, rng, carry):
      tokens = batch["tokens"]
      inputs, targets = tokens[:, :-1], tokens[:, 1:]
      logp = policy_logprobs(graphdef, self.weights(params, buffers), inputs, targets, sampling)
      ref = None
      if g.beta > 0:  # the frozen reference: a copy of the start, or with LoRA the base with the adapters off
        ref = jax.lax.stop_gradient(policy_logprobs(*self.reference(graphdef, buffers), inputs, targets, sampling))
      value, sums = policy_loss(logp, batch["behaviour"][:, :-1], batch["advantages"], batch["loss_mask"][:, :-1] > 0,
                                ref, epsilon=g.epsilon, epsilon_high=g.epsilon_high, beta=g.beta,
                                loss_norm=g.loss_norm, max_new_tokens=max_new_tokens, **g.correction)
      sums = {**sums, "reward_sum": jnp.sum(batch["reward"]), "correct_sum": jnp.sum(batch["correct"]),
              "loss_sum": value * tokens.shape[0], "row_tokens_sum": jnp.float32(tokens.size)}
      return value, (carry, sums)
    return loss

  def normalize(self, raw: dict, global_batch: int) -> dict:
    tokens = max(raw["tokens"], 1.0)
    out = {"loss": raw["loss_sum"] / global_batch, "reward": raw["reward_sum"] / global_batch,
           "accuracy_sampled": raw["correct_sum"] / global_batch, "clip_fraction": raw["clipped_sum"] / tokens,
           "kl": raw["kl_sum"] / tokens, "ratio": raw["ratio_sum"] / tokens,
           "logprob_gap": raw["logprob_gap_sum"] / tokens, "completion_tokens": raw["tokens"],
           "row_len": raw["row_tokens_sum"] / global_batch}  # tokens per trained row (grpo.trim_rows)
    out.update(correction_metrics(raw, global_batch))
    out.update({k: raw[k] for k in ("lr", "grad_norm") if k in raw})
    return out

  def hooks(self, graphdef, mesh, tcfg) -> list:
    return self.source.hooks(graphdef, mesh) + super().hooks(graphdef, mesh, tcfg)
