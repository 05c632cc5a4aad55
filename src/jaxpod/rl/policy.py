"""The two tasks `jaxpod rl` gives the one trainer (`jaxpod.train`): supervised warm-up, then GRPO.

Both train the same Llama policy and report the same held-out metric (greedy exact-match
accuracy, `eval/accuracy`). They differ in data and loss:

  rl_warmup  rows BOS + prompt + answer + EOS from the task's own generator (stream 1),
             next-token loss on the answer and EOS only;
  rl_grpo    rows of rollouts (`rollouts.to_batch`) from a `source` iterator: the colocated
             engine (`colocated.py`) or the rollout queue (`trainer_side.py`); the GRPO loss
             (`grpo.policy_loss`) against the engine's behaviour log-probs.

Each ends by writing the policy as a HF checkpoint (`HFExportHook`, before the final checkpoint,
so a finished run always has its export). RL starts from the warm-up's export or `model.hf`.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from jaxpod.runtime import storage
from jaxpod.runtime.hooks import Hook, StepInfo
from jaxpod.train.config import DataConfig, TaskConfig, TrainConfig


def tokenizer_for(rl) -> Any:
  """The policy's tokenizer: the HF checkpoint's (model.hf), else byte-level."""
  from jaxpod.models.llama.tokenizer import ByteTokenizer, load_tokenizer
  return load_tokenizer(rl.model.hf) if rl.model.hf else ByteTokenizer()


def model_config(rl, start_from: str | None):
  """The architecture: the starting checkpoint's config.json if any, else the config's `model`."""
  from jaxpod.models.llama import hf_io
  return hf_io.load_config(start_from) if start_from else rl.model.llama()


class HFExportHook(Hook):
  """At the final step, write the policy as a HF checkpoint (every host takes part; the leader writes)."""

  def __init__(self, graphdef, url: str):
    self.graphdef, self.url = graphdef, url

  def due(self, step: int, final: bool) -> bool:
    return final

  def __call__(self, info: StepInfo) -> None:
    from flax import nnx
    from jaxpod.models.llama import hf_io
    hf_io.save(nnx.merge(self.graphdef, info.state.params), self.url)
    return None


class Accuracy:
  """Greedy accuracy on the held-out problems, and pass@k with `eval.k` (the trainer's evaluator)."""

  def __init__(self, rl, graphdef, mesh, tokenizer, stop_ids):
    from jaxpod.rl.rewards import Scorer
    self.rl, self.graphdef, self.mesh, self.tokenizer, self.stop_ids = rl, graphdef, mesh, tokenizer, stop_ids
    self.problems = rl.task.eval_set(rl.trainer.seed)
    self.scorer = Scorer(rl.rewards, rl.reward_weights, rl.task)
    self.sampler = None
    self.sampling = None  # pass@k: the rollout engine's shapes and temperature (its programs are the rollouts')

  def __call__(self, params, buffers) -> dict:
    import time
    from jaxpod.rl.sampling import accuracy, make_sampler, pass_at_k
    t0 = time.perf_counter()
    if self.sampler is None:
      self.sampler = make_sampler(self.graphdef, params, self.mesh, self.rl.rollout, self.stop_ids, greedy=True)
    else:
      self.sampler.update_params(params, self.sampler.version + 1)
    out = accuracy(self.sampler, self.tokenizer, self.scorer, self.problems)
    ev = self.rl.eval
    if ev.k:
      if self.sampling is None:
        self.sampling = make_sampler(self.graphdef, params, self.mesh, self.rl.rollout, self.stop_ids)
      else:
        self.sampling.update_params(params, self.sampling.version + 1)
      out |= pass_at_k(self.sampling, self.tokenizer, self.scorer, self.problems, ev.n, ev.k, self.rl.trainer.seed)
    return out | {"seconds": time.perf_counter() - t0}


class _PolicyTask:
  """What both tasks share: the Llama policy, its optimizer shape, the accuracy evaluator, the export."""

  headline = "accuracy"

  def __init__(self, cfg: TrainConfig, rl, start_from: str | None, export_to: str | None):
    self.cfg, self.rl, self.start_from, self.export_to = cfg, rl, start_from, export_to
    self.tokenizer = tokenizer_for(rl)
    self.llama = model_config(rl, start_from)
    self.stop_ids = tuple(sorted(set(self.tokenizer.eos_ids) | set(self.llama.eos_token_id)))
    self.host, self.hosts = 0, 1

  def prepare(self) -> dict:
    return {}

  def setup(self, prepared, host_index: int, host_count: int) -> None:
    self.host, self.hosts = host_index, host_count

  def _buffers(self, params) -> dict:
    return {}

  def abstract_model(self, seed: int):
    from flax import nnx
    from jaxpod.models.llama import abstract
    graphdef, params = nnx.split(abstract(self.llama))
    return graphdef, params, self._buffers(params)

  def init_model(self, seed: int):
    from flax import nnx
    from jaxpod.models.llama import Llama
    params = nnx.split(Llama(self.llama, rngs=nnx.Rngs(params=seed)))[1]
    return params, self._buffers(params)

  def initial_params(self, mesh, shardings):
    """The starting checkpoint's weights placed like the trainer's params; None: random init."""
    if not self.start_from:
      return None
    import jax
    from flax import nnx
    from jaxpod.models.llama import hf_io
    params = jax.device_put(nnx.split(hf_io.load(self.start_from, mesh, cfg=self.llama))[1], shardings.params)
    return params, self._buffers(params)

  def init_carry(self, global_batch: int):
    return ()

  def _adamw(self, lr: float, warmup: int, weight_decay: float, grad_clip: float):
    import jax
    import optax
    sched = optax.linear_schedule(0.0, lr, max(warmup, 1)) if warmup else optax.constant_schedule(lr)
    decay_mask = lambda params: jax.tree.map(lambda x: x.ndim > 1, params)  # no decay on norm weights
    adamw = optax.adamw(sched, b1=0.9, b2=0.99, weight_decay=weight_decay, mask=decay_mask)
    return (optax.chain(optax.clip_by_global_norm(grad_clip), adamw) if grad_clip else adamw), sched

  def evaluator(self, graphdef, mesh, ema_sh, buffer_sh, batch_sh) -> Callable[[Any, Any], dict]:
    return Accuracy(self.rl, graphdef, mesh, self.tokenizer, self.stop_ids)

  def hooks(self, graphdef, mesh, tcfg) -> list:
    return [HFExportHook(graphdef, self.export_to)] if self.export_to else []

  def eval_summary(self, ev: dict) -> list[tuple[str, str]]:
    return [("held-out accuracy", f"{ev.get('accuracy', float('nan')):.1%} of {ev.get('count', 0)} problems")]

  def _local(self, arrays: dict) -> dict:
    """This host's contiguous share of the global rows."""
    rows = next(iter(arrays.values())).shape[0]
    share = rows // self.hosts
    return {k: v[self.host * share:(self.host + 1) * share] for k, v in arrays.items()}


# ----------------------------------------------------------------------------- warm-up
@TaskConfig.register_subclass("rl_warmup")
@dataclasses.dataclass(frozen=True)
class WarmupTaskConfig(TaskConfig):
  """Supervised warm-up of an RL policy on its task's problems (built by `jaxpod rl`, not by hand)."""

  data: DataConfig = dataclasses.field(default_factory=DataConfig)
  rl: Any = None  # the RLConfig
  start_from: str | None = None  # HF checkpoint to start from (None: random init)
  export_to: str | None = None  # HF checkpoint written at the end
  bar_metrics: tuple[str, ...] = ("loss",)
  plot_metrics: tuple[str, ...] = ("loss", "accuracy")

  prefix = "warmup"

  def build(self, cfg: TrainConfig) -> "WarmupTask":
    return WarmupTask(cfg, self.rl, self.start_from, self.export_to)


class WarmupIterator:
  """Global batch k = problems k*B..(k+1)*B-1 of stream 1, as rows; this host yields its share."""

  def __init__(self, task: "WarmupTask"):
    self.task, self.k = task, 0

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    t, rl = self.task, self.task.rl
    b = rl.warmup.batch_size
    problems = rl.task.train_problems(rl.trainer.seed, 1, self.k * b, b)
    self.k += 1
    return t._local(t.rows(problems))

  def get_state(self) -> dict:
    return {"batches": self.k}

  def set_state(self, state: dict) -> None:
    self.k = int(state["batches"])


class WarmupTask(_PolicyTask):
  """Next-token loss on answer + EOS of the task's own problems."""

  name = "warmup"
  batch_ndims = {"tokens": 2, "loss_mask": 2}

  def rows(self, problems) -> dict[str, np.ndarray]:
    """tokens [B, T] and the target-aligned loss mask over answer + EOS."""
    from jaxpod.rl.sampling import answer_ids
    r = self.rl.rollout
    length = r.max_prompt_len + r.max_new_tokens
    tokens = np.full((len(problems), length), self.tokenizer.pad_id, np.int32)
    mask = np.zeros((len(problems), length), np.int32)
    for i, p in enumerate(problems):
      prompt = self.tokenizer.encode(p.prompt)
      answer = answer_ids(self.tokenizer, self.rl.task.demonstration(p)) + [self.stop_ids[0]]
      row = prompt + answer
      tokens[i, :len(row)] = row
      mask[i, len(prompt) - 1:len(row) - 1] = 1
    return {"tokens": tokens, "loss_mask": mask}

  def train_iter(self):
    return WarmupIterator(self)

  def optimizer(self):
    w = self.rl.warmup
    return self._adamw(w.lr, max(1, w.steps // 10), 0.0, 1.0)

  def loss_fn(self, graphdef) -> Callable:
    import jax.numpy as jnp
    import optax
    from jaxpod.models.llama.model import forward

    def loss(params, buffers, batch, rng, carry):
      tokens = batch["tokens"]
      logits = forward(graphdef, params, tokens[:, :-1]).logits
      mask = batch["loss_mask"][:, :-1] > 0
      ce = optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:])
      total, count = jnp.sum(jnp.where(mask, ce, 0.0)), jnp.sum(mask).astype(jnp.float32)
      return total / jnp.maximum(count, 1.0), (carry, {"loss_sum": total, "tokens": count})
    return loss

  def normalize(self, raw: dict, global_batch: int) -> dict:
    out = {"loss": raw["loss_sum"] / max(raw["tokens"], 1.0)}
    out.update({k: raw[k] for k in ("lr", "grad_norm") if k in raw})
    return out


# ----------------------------------------------------------------------------- GRPO
@TaskConfig.register_subclass("rl_grpo")
@dataclasses.dataclass(frozen=True)
class GRPOTaskConfig(TaskConfig):
  """GRPO on rollouts (built by `jaxpod rl`, not by hand)."""

  data: DataConfig = dataclasses.field(default_factory=DataConfig)
  rl: Any = None  # the RLConfig
  start_from: str | None = None  # HF checkpoint the policy starts from
  export_to: str | None = None  # HF checkpoint written at the end
  source: str = "colocated"  # where rollouts come from: colocated (this job's engine) | queue (rollout workers)
  run_dir: str = ""  # the RL run folder (queue, weights)
  bar_metrics: tuple[str, ...] = ("reward", "loss")
  plot_metrics: tuple[str, ...] = ("reward", "accuracy")

  prefix = "grpo"

  def build(self, cfg: TrainConfig) -> "GRPOTask":
    return GRPOTask(cfg, self)


class GRPOTask(_PolicyTask):
  """The clipped-ratio GRPO loss on rollout batches from the colocated engine or the queue."""

  name = "grpo"
  batch_ndims = {"tokens": 2, "loss_mask": 2, "behaviour": 2, "advantages": 1, "reward": 1, "correct": 1}

  def __init__(self, cfg: TrainConfig, tc: GRPOTaskConfig):
    super().__init__(cfg, tc.rl, tc.start_from, tc.export_to)
    self.tc = tc
    self.source = None  # made in setup: the iterator the trainer pulls batches from

  def setup(self, prepared, host_index: int, host_count: int) -> None:
    super().setup(prepared, host_index, host_count)
    if self.tc.source == "colocated":
      from jaxpod.rl.colocated import RolloutBuffer
      self.source = RolloutBuffer(self)
    else:
      from jaxpod.rl.trainer_side import QueueSource
      self.source = QueueSource(self, self.tc.run_dir)

  def _buffers(self, params) -> dict:
    return {"ref": params} if self.rl.grpo.beta > 0 else {}

  def train_iter(self):
    return self.source

  def optimizer(self):
    g = self.rl.grpo
    return self._adamw(g.lr, 5, g.weight_decay, g.grad_clip)

  def loss_fn(self, graphdef) -> Callable:
    import jax
    import jax.numpy as jnp
    from jaxpod.models.llama.model import forward
    from jaxpod.rl.grpo import policy_loss, token_logprobs
    g, temperature = self.rl.grpo, self.rl.rollout.temperature

    def loss(params, buffers, batch, rng, carry):
      tokens = batch["tokens"]
      inputs, targets = tokens[:, :-1], tokens[:, 1:]
      logp = token_logprobs(forward(graphdef, params, inputs).logits, targets, temperature)
      ref = None
      if g.beta > 0:
        ref = jax.lax.stop_gradient(token_logprobs(forward(graphdef, buffers["ref"], inputs).logits, targets,
                                                   temperature))
      value, sums = policy_loss(logp, batch["behaviour"][:, :-1], batch["advantages"], batch["loss_mask"][:, :-1] > 0,
                                ref, epsilon=g.epsilon, epsilon_high=g.epsilon_high, beta=g.beta,
                                loss_norm=g.loss_norm, max_new_tokens=self.rl.rollout.max_new_tokens)
      sums = {**sums, "reward_sum": jnp.sum(batch["reward"]), "correct_sum": jnp.sum(batch["correct"]),
              "loss_sum": value * tokens.shape[0]}
      return value, (carry, sums)
    return loss

  def normalize(self, raw: dict, global_batch: int) -> dict:
    tokens = max(raw["tokens"], 1.0)
    out = {"loss": raw["loss_sum"] / global_batch, "reward": raw["reward_sum"] / global_batch,
           "accuracy_sampled": raw["correct_sum"] / global_batch, "clip_fraction": raw["clipped_sum"] / tokens,
           "kl": raw["kl_sum"] / tokens, "ratio": raw["ratio_sum"] / tokens,
           "logprob_gap": raw["logprob_gap_sum"] / tokens, "completion_tokens": raw["tokens"]}
    out.update({k: raw[k] for k in ("lr", "grad_norm") if k in raw})
    return out

  def hooks(self, graphdef, mesh, tcfg) -> list:
    return self.source.hooks(graphdef, mesh) + super().hooks(graphdef, mesh, tcfg)

  def batch_arrays(self, groups) -> dict[str, np.ndarray]:
    """The global batch of these groups (every host builds the same one)."""
    from jaxpod.rl.rollouts import to_batch
    r = self.rl.rollout
    return to_batch(groups, r.max_prompt_len + r.max_new_tokens, self.tokenizer.pad_id, self.rl.grpo.scale_rewards)


def check_rows(rl, hosts: int) -> None:
  """The per-step rows split over hosts in whole groups (so group advantages never straddle hosts' shares)."""
  g = rl.grpo
  if g.rows % hosts or (g.rows // hosts) % g.num_generations:
    raise ValueError(f"rl.grpo: {g.num_prompts_per_step} prompts x {g.num_generations} samples = {g.rows} rows do "
                     f"not split into whole groups over {hosts} hosts; make num_prompts_per_step a multiple of "
                     f"{hosts}")
  if rl.warmup.batch_size % hosts:
    raise ValueError(f"rl.warmup.batch_size={rl.warmup.batch_size} is not divisible by the {hosts} hosts")
