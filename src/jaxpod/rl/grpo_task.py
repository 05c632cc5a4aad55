"""`rl_grpo`: the GRPO task `jaxpod rl` gives the one trainer (`jaxpod.train`), after the policy's warm-up.

It trains the policy (`policy.task.PolicyTask`, as the warm-up `policy.warmup.WarmupTask` does) and reports the same
held-out metric (greedy exact-match accuracy, `eval/accuracy`), on rows of rollouts (`batch.to_batch`) from the
batch source it is handed, built where the topology is decided (`run.py`): the colocated engine
(`colocated.BatchSlot`) or the rollout queue (`disaggregated.queue_source.QueueSource`); the GRPO loss
(`grpo.policy_loss`) against the engine's behaviour log-probs, with the trainer's log-probs under the engine's
sampling distribution (`grpo.policy_logprobs`).

    task = GRPOTask(train_cfg, source)        # train(train_cfg, task=task): the source is an argument, not config

Its config carries only its own typed slices of `RLConfig` (resolved by `run.py`). It ends by writing the policy as
a HF checkpoint (before the final checkpoint, so a finished run always has its export). RL starts from the
warm-up's export or `model.hf`.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from jaxpod.policy.spec import PolicySpec
from jaxpod.policy.task import PolicyTask
from jaxpod.policy.warmup import default_policy, default_problems
from jaxpod.problems.rewards import VerifiedProblems
from jaxpod.rl.batch import BatchSource
from jaxpod.policy.engine import EngineOptions
from jaxpod.rl.config import GRPOConfig
from jaxpod.rl.grpo import correction_metrics
from jaxpod.train.config import DataConfig, TaskConfig, TrainConfig


@TaskConfig.register_subclass("rl_grpo")
@dataclasses.dataclass(frozen=True)
class GRPOTaskConfig(TaskConfig):
  """GRPO on rollouts (built by `jaxpod rl`, not by hand)."""

  data: DataConfig = dataclasses.field(default_factory=DataConfig)
  policy: PolicySpec = dataclasses.field(default_factory=default_policy)  # the architecture and starting weights
  problems: VerifiedProblems = dataclasses.field(default_factory=default_problems)  # sampled, scored and evaluated
  grpo: GRPOConfig = dataclasses.field(default_factory=GRPOConfig)  # the algorithm
  rollout: EngineOptions = dataclasses.field(default_factory=EngineOptions)  # the engine's sampling options
  export_to: str | None = None  # HF checkpoint written at the end
  bar_metrics: tuple[str, ...] = ("reward", "loss")
  plot_metrics: tuple[str, ...] = ("reward", "accuracy")

  prefix = "grpo"

  def build(self, cfg: TrainConfig) -> "GRPOTask":
    raise ValueError("rl_grpo trains from a batch source, which is no config: jaxpod rl builds one (colocated."
                     "BatchSlot or QueueSource) and runs train(cfg, task=GRPOTask(cfg, source))")


class GRPOTask(PolicyTask):
  """The clipped-ratio GRPO loss on the rollout batches of the source it is handed (an iterator of this host's
  rows with `get_state` / `set_state`, and `hooks(graphdef, mesh)`: what keeps it filled)."""

  name = "grpo"
  batch_ndims = {"tokens": 2, "loss_mask": 2, "behaviour": 2, "advantages": 1, "reward": 1, "correct": 1}

  def __init__(self, cfg: TrainConfig, source: BatchSource):
    tc = cfg.task
    super().__init__(cfg, tc.policy, tc.problems, tc.rollout, tc.export_to)
    self.grpo, self.source = tc.grpo, source
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

  def abstract_batch(self, rows: int, seq_len: int) -> dict:
    """The rollout batch's shapes (global, unsharded) for `rows` rows of `seq_len` tokens (`batch.to_batch`'s
    dtypes: the log-probs, advantages and rewards float32), nothing allocated: what `jaxpod plan --compile` lowers this step with."""
    import jax
    import jax.numpy as jnp
    floats = {"behaviour", "advantages", "reward", "correct"}
    return {k: jax.ShapeDtypeStruct((rows, seq_len)[:n], jnp.float32 if k in floats else jnp.int32)
            for k, n in self.batch_ndims.items()}

  def loss_fn(self, graphdef) -> Callable:
    import jax
    import jax.numpy as jnp
    from jaxpod.rl.grpo import policy_logprobs, policy_loss
    g, sampling = self.grpo, self.options.sampling()  # the distribution the engine drew the tokens from
    max_new_tokens = self.options.max_new_tokens

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
