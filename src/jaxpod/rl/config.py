"""`RLConfig`: every section of `jaxpod rl`, frozen dataclasses validated before JAX starts (invariant 7).

    jaxpod rl                                        # the built-in default (addition, colocated)
    jaxpod rl --grpo.num_generations 8 --trainer.steps 300 --topology disaggregated

Sections: problems (the problem set, `jaxpod.problems`: what the policy solves; `--task.*` before, still accepted),
rewards, model (architecture, or `model.hf` to start from a HF checkpoint), warmup (supervised steps on the problem
set's own data before RL), grpo (the algorithm), lora (GRPO on adapters only, `--lora.rank 1`), rollout (the engine
and the workers), transfer (weights between clusters when disaggregated), trainer / tracker / runtime / mesh (as in
`jaxpod train`).
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

from jaxpod.policy.engine import EngineOptions
from jaxpod.policy.lora import LoraSection
from jaxpod.policy.spec import PolicyModelConfig
from jaxpod.policy.warmup import WarmupConfig
from jaxpod.problems import DatasetProblems, ProblemSet, SortProblems
from jaxpod.problems.passk import EvalConfig
from jaxpod.rl.grpo import LOSS_NORMS, MIS_LEVELS, SCALE_REWARDS, TIS_LEVELS, BatchFill
from jaxpod.runtime.mesh import MeshConfig
from jaxpod.runtime.state import RuntimeConfig
from jaxpod.train.config import TrackerConfig, TrainerConfig
from jaxpod.transfer.config import TransferConfig

TOPOLOGIES = ("colocated", "disaggregated")
ROLES = ("auto", "trainer", "rollout")
UPDATES = ("inflight", "drain")


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
  """The algorithm: n samples per prompt, group-relative advantages, clipped ratio vs the engine's log-probs."""

  num_prompts_per_step: int = 32  # prompts (groups) per optimizer step
  filter_groups: bool = True  # DAPO's dynamic sampling: drop groups whose samples all got the same reward, draw others
  sample_prompts_per_step: int = 128  # colocated: prompts per sampling round (0: num_prompts_per_step), until a batch is full
  max_sampling_rounds: int = 8  # filter_groups: a batch ends the run after this x sampled_prompts groups judged
  num_generations: int = 8  # samples per prompt, n (>= 2: the group baseline needs two)
  epsilon: float = 0.2  # lower clip: ratio >= 1 - epsilon
  epsilon_high: float = 0.28  # upper clip: ratio <= 1 + epsilon_high (DAPO's clip-higher; = epsilon is symmetric)
  beta: float = 0.0  # KL weight to the frozen starting policy (0: no reference model kept)
  scale_rewards: str = "group"  # advantage scale: group (GRPO) | batch | none (Dr. GRPO)
  loss_norm: str = "token"  # token (DAPO/TRL: over all completion tokens) | sequence (GRPO) | constant (Dr. GRPO)
  trim_rows: bool = True  # train a batch at the shortest of 32, 48, 64, 96... tokens holding its longest row (false: max)
  max_policy_lag: int = 2  # oldest version a trained token may come from: trainer version - this (older: dropped)
  num_iterations: int = 0  # optimizer updates per rollout batch in one step (TRL's; GRPO's mu); 0: 2 with LoRA, else 1
  lr: float = 3e-4  # AdamW learning rate (constant after a 5-step warm-up)
  weight_decay: float = 0.0  # AdamW decoupled weight decay
  grad_clip: float = 1.0  # global-norm clip (0: none)
  tis: str = "none"  # truncated importance sampling: weight min(pi_old/mu, tis_cap) per token | sequence (none: off)
  tis_cap: float = 2.0  # TIS cap C on the weight (verl's rollout_is_threshold, slime's tis_clip, TRL's cap)
  mis: str = "none"  # masked importance sampling: drop token | sequence | geometric whose ratio leaves [mis_low, mis_high]
  mis_low: float = 0.5  # MIS: lower bound of the kept ratio band
  mis_high: float = 2.0  # MIS: upper bound of the kept ratio band

  def __post_init__(self):
    if self.num_generations < 2:
      raise ValueError(f"rl.grpo.num_generations={self.num_generations}: GRPO needs n >= 2 samples per prompt "
                       "(the advantage is relative to the group); use 2 or more")
    if self.num_prompts_per_step < 1:
      raise ValueError(f"rl.grpo.num_prompts_per_step={self.num_prompts_per_step} must be >= 1")
    if not 0 < self.epsilon < 1 or self.epsilon_high <= 0:
      raise ValueError(f"rl.grpo.epsilon={self.epsilon} must be in (0, 1) and epsilon_high={self.epsilon_high} > 0")
    if self.beta < 0 or self.lr <= 0 or self.weight_decay < 0 or self.grad_clip < 0:
      raise ValueError("rl.grpo: beta, weight_decay, grad_clip must be >= 0 and lr > 0")
    if self.scale_rewards not in SCALE_REWARDS:
      raise ValueError(f"rl.grpo.scale_rewards={self.scale_rewards!r}; use one of {SCALE_REWARDS}")
    if self.loss_norm not in LOSS_NORMS:
      raise ValueError(f"rl.grpo.loss_norm={self.loss_norm!r}; use one of {LOSS_NORMS}")
    if self.sample_prompts_per_step and self.sample_prompts_per_step < self.num_prompts_per_step:
      raise ValueError(f"rl.grpo.sample_prompts_per_step={self.sample_prompts_per_step} must be 0 or >= "
                       f"num_prompts_per_step={self.num_prompts_per_step}")
    if self.max_sampling_rounds < 1:
      raise ValueError(f"rl.grpo.max_sampling_rounds={self.max_sampling_rounds} must be >= 1")
    if self.num_iterations < 0:
      raise ValueError(f"rl.grpo.num_iterations={self.num_iterations} must be >= 1 (updates per rollout batch), or 0 "
                       "for the default (2 with LoRA, 1 without)")
    if self.max_policy_lag < 0:
      raise ValueError(f"rl.grpo.max_policy_lag={self.max_policy_lag} must be >= 0")
    if self.tis not in TIS_LEVELS or self.mis not in MIS_LEVELS:
      raise ValueError(f"rl.grpo.tis={self.tis!r} / mis={self.mis!r}; use one of {TIS_LEVELS} / {MIS_LEVELS}")
    if self.tis_cap <= 0 or not 0 <= self.mis_low < self.mis_high:
      raise ValueError(f"rl.grpo.tis_cap={self.tis_cap} must be > 0 and 0 <= mis_low={self.mis_low} < "
                       f"mis_high={self.mis_high}; e.g. tis_cap 2, mis_low 0.5, mis_high 2")

  @property
  def correction(self) -> dict:
    """The off-policy correction options, as `grpo.policy_loss` takes them."""
    return {k: getattr(self, k) for k in ("tis", "tis_cap", "mis", "mis_low", "mis_high")}

  @property
  def sampled_prompts(self) -> int:
    """Prompts sampled per step (colocated)."""
    return self.sample_prompts_per_step or self.num_prompts_per_step

  def updates_per_batch(self, lora: bool) -> int:
    """num_iterations, or its default: 2 updates per batch when training LoRA adapters (rank 1 and 16 end 8-20
    points higher on the same samples, docs/lora.md), 1 for full fine-tuning."""
    return self.num_iterations or (2 if lora else 1)

  def batch_fill(self, trainer_version: int) -> BatchFill:
    """One batch's admissions for the trainer at `trainer_version`, with the bound on its wait (both topologies)."""
    return BatchFill(self.num_prompts_per_step, trainer_version, max_policy_lag=self.max_policy_lag,
                     filter_groups=self.filter_groups, limit=self.max_sampling_rounds * self.sampled_prompts)

  @property
  def rows(self) -> int:
    """Sequences per optimizer step (prompts x samples)."""
    return self.num_prompts_per_step * self.num_generations


@dataclasses.dataclass(frozen=True)
class RolloutConfig(EngineOptions):
  """The policy's engine options (`jaxpod.policy.engine.EngineOptions`: `jaxpod.sample`'s sampling options with the
  policy's defaults) and the rollout workers of the disaggregated topology.

  n and seed are not RL's to set here: samples per prompt are grpo.num_generations, request seeds come
  from trainer.seed."""

  section: ClassVar[str] = "rl.rollout"
  update: str = "inflight"  # disaggregated workers: inflight (swap weights between decode steps) | drain (finish, then swap)
  worker_id: int = 0  # this worker's number (role rollout)
  workers: int = 1  # rollout workers `--role auto` starts (disaggregated)
  hosts: int = 1  # hosts per rollout worker `--role auto` starts (disaggregated)
  groups_per_file: int = 8  # prompts (groups) per rollout file a worker writes to the queue
  max_queued_files: int = 8  # a worker pauses while this many of its files wait unconsumed (bounds staleness)
  wait_for_weights_s: float = 900.0  # a worker fails if no weights are published within this (names the trainer)
  heartbeat_s: float = 2.0  # how often a worker's leader writes its heartbeat
  worker_timeout_s: float = 15.0  # the trainer names a worker lost after this long without a heartbeat
  rollout_timeout_s: float = 900.0  # the trainer fails if no usable rollout arrives for this long

  def __post_init__(self):
    super().__post_init__()
    for name in ("workers", "hosts", "groups_per_file", "max_queued_files"):
      if getattr(self, name) < 1:
        raise ValueError(f"rl.rollout.{name}={getattr(self, name)} must be >= 1")
    if self.worker_id < 0:
      raise ValueError(f"rl.rollout.worker_id={self.worker_id} must be >= 0")
    if self.update not in UPDATES:
      raise ValueError(f"rl.rollout.update={self.update!r}; use one of {UPDATES}")
    for name in ("wait_for_weights_s", "heartbeat_s", "worker_timeout_s", "rollout_timeout_s"):
      if getattr(self, name) <= 0:
        raise ValueError(f"rl.rollout.{name}={getattr(self, name)} must be > 0 seconds")

# Sections with RL's own defaults are subclasses, not default_factory values: draccus rebuilds a
# section from its class defaults as soon as one of its fields is given on the command line.
@dataclasses.dataclass(frozen=True)
class RLLoraConfig(LoraSection):
  """LoRA for RL (`--lora.rank N` turns it on): the causal-LM adapters, GRPO's learning rate scaled for them."""

  section: ClassVar[str] = "rl.lora"
  lr_scale: float = 5.0  # GRPO trains the adapters at grpo.lr x this (measured best of 2.5-20 here; docs/lora.md)
  b_lr_ratio: float = 1.0  # LoRA+: B's lr / A's lr (1/4, 2, 4 no better at rank 1; 2 mixed at rank 16: docs/lora.md)


@dataclasses.dataclass(frozen=True)
class RLTrainerConfig(TrainerConfig):
  """`jaxpod train`'s trainer section with RL's defaults (steps are rollout batches; metrics every step)."""

  steps: int = 150  # GRPO steps (one rollout batch each)
  eval_every: int = 25  # held-out accuracy every N steps (and at the end)
  eval_at_start: bool = True  # accuracy of the starting policy (summary: accuracy.start)
  checkpoint_every: int = 50  # checkpoint every N steps (and at the end)
  log_every: int = 1  # metrics every step (an RL step is slow; the reward curve needs them all)
  ema: float = 0.0  # RL evaluates and exports the live policy
  preemption_check_every: int = 1  # a SIGTERM is honoured at the next step


@dataclasses.dataclass(frozen=True)
class RLTransferConfig(TransferConfig):
  """`jaxpod.transfer`'s config with RL's defaults: versions and records in the run's shared storage."""

  mode: str = "checkpoint"  # checkpoint | arrow_flight | ray | jax_transfer (see docs/transfer.md)
  coordinator: str | None = "filesystem"  # where versions are registered; filesystem = in `folder`
  folder: str = "weights"  # relative: inside the run folder, so trainer and workers find it from the run alone
  background: bool = True  # upload while the next step trains; a version is seen one step later (needs grpo.max_policy_lag >= 1)


@dataclasses.dataclass(frozen=True)
class RLConfig:
  """`jaxpod rl`: warm-up, then GRPO with rollouts from the continuous engine (see the module docstring)."""

  old_names: ClassVar[dict[str, str]] = {"task": "problems"}  # accepted, warned once (a task is the trainer's)

  problems: ProblemSet = dataclasses.field(default_factory=SortProblems)  # sort|addition|dataset|calculator|python
  rewards: tuple[str, ...] = ("exact_match",)  # reward plugins (registered names or "module:function"), summed
  reward_weights: tuple[float, ...] = ()  # one weight per reward (empty: all 1.0)
  model: PolicyModelConfig = dataclasses.field(default_factory=PolicyModelConfig)  # the policy (or model.hf)
  warmup: WarmupConfig = dataclasses.field(default_factory=WarmupConfig)  # supervised steps before RL
  grpo: GRPOConfig = dataclasses.field(default_factory=GRPOConfig)  # the algorithm
  rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)  # engine + workers
  eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)  # pass@k next to greedy accuracy
  lora: RLLoraConfig | None = None  # GRPO on LoRA adapters, the base frozen (the warm-up's export or model.hf)
  topology: str = "colocated"  # colocated: one cluster, trainer and engine alternate | disaggregated: two clusters
  role: str = "auto"  # auto: everything here (disaggregated: launches the clusters) | trainer | rollout
  trainer_hosts: int = 1  # disaggregated, role auto: hosts of the trainer cluster it launches
  transfer: RLTransferConfig = dataclasses.field(default_factory=RLTransferConfig)  # disaggregated weight transport
  export_hf: bool = True  # write the final policy as a HF checkpoint (<run>/hf)
  trainer: RLTrainerConfig = dataclasses.field(default_factory=RLTrainerConfig)  # RL steps, cadences, runs_dir
  tracker: TrackerConfig = dataclasses.field(default_factory=TrackerConfig)  # metrics sinks
  runtime: RuntimeConfig = dataclasses.field(default_factory=RuntimeConfig)  # how this process joins its job
  mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)  # this cluster's mesh

  def __post_init__(self):
    if self.topology not in TOPOLOGIES:
      raise ValueError(f"rl.topology={self.topology!r}; use one of {TOPOLOGIES}")
    if self.role not in ROLES:
      raise ValueError(f"rl.role={self.role!r}; use one of {ROLES}")
    if self.role != "auto" and self.topology != "disaggregated":
      raise ValueError(f"rl.role={self.role!r} needs --topology disaggregated (colocated runs one job: role auto)")
    if self.trainer_hosts < 1:
      raise ValueError(f"rl.trainer_hosts={self.trainer_hosts} must be >= 1")
    if self.lora is not None and not self.model.hf and self.warmup.steps == 0:
      raise ValueError("rl.lora: adapters train on a frozen base, and a random base has nothing to adapt; set "
                       "--model.hf to a HF checkpoint or --warmup.steps > 0 (the warm-up trains every weight first)")
    if isinstance(self.problems, DatasetProblems) and not self.problems.chat_template and self.model.hf:
      # message prompts are rendered with the policy's own chat template unless another is named
      object.__setattr__(self, "problems", dataclasses.replace(self.problems, chat_template=self.model.hf))
    if self.topology == "disaggregated" and self.transfer.background and self.grpo.max_policy_lag < 1:
      raise ValueError("rl.transfer.background=true publishes version k while step k+1 trains, so workers sample "
                       f"one version behind; rl.grpo.max_policy_lag={self.grpo.max_policy_lag} admits none: set "
                       "--grpo.max_policy_lag 1 or more, or --transfer.background false")
    if self.rollout.groups_per_file > self.grpo.num_prompts_per_step:
      raise ValueError(f"rl.rollout.groups_per_file={self.rollout.groups_per_file} exceeds "
                       f"rl.grpo.num_prompts_per_step={self.grpo.num_prompts_per_step}; lower it")
