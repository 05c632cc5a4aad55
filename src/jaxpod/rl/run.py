"""`run(RLConfig)`: what `jaxpod rl` does, by topology and role.

The run folder is `<trainer.runs_dir>/<trainer.run_name or rl-<config hash>>`; the hash leaves out
what differs between the jobs of one run (role, worker id, runtime, mesh, cadences), so the
trainer and every rollout worker of a disaggregated run find the same folder, and rerunning the
same command resumes it. Inside:

    warmup/    the supervised warm-up run (jaxpod train layout) and its export warmup/hf/
    train/     the GRPO run: metrics.jsonl, checkpoints/ (the data state says what was trained on)
    queue/     disaggregated: rollout files, worker heartbeats, the trainer's progress record
    weights/   disaggregated: published policy versions (transfer.folder, when relative)
    hf/        the final policy as a HF checkpoint
    summary.json, rl.png

  colocated        one job (any number of hosts): warm-up, then GRPO with the engine on the
                   trainer's devices, alternating with the train steps;
  disaggregated    role trainer: warm-up, then GRPO on rollouts from the queue, publishing weights
                   every step; role rollout: a worker job sampling with the newest weights;
                   role auto: both, as `jaxpod launch` clusters on this machine.

`RLConfig` is checked once (`checks.before_jax`) and resolved here into typed slices; each part gets
only its own: the policy (one `PolicySpec` per run, its tokenizer read once), the problems and rewards
(`VerifiedProblems`), `GRPOConfig`, the engine's sampling options (`RolloutConfig`, the policy's
`EngineOptions`), the queue (the run folder) and the transport (`TransferConfig`, its folder resolved in the
run folder). The topology is decided here: the GRPO task is handed the batch source it trains from
(`batch_source`), as an argument.
"""
from __future__ import annotations

import dataclasses

from jaxpod.policy.spec import PolicySpec
from jaxpod.problems import ProblemSet
from jaxpod.problems.rewards import VerifiedProblems
from jaxpod.rl.config import RLConfig
from jaxpod.runtime import storage
from jaxpod.runtime.log import get_logger
from jaxpod.transfer.config import TransferConfig

log = get_logger("rl")

RUN_ID_IGNORES = ("role", "trainer_hosts", "runtime", "mesh", "tracker", "rollout.worker_id", "rollout.workers", "rollout.hosts",
                  "trainer.steps", "trainer.runs_dir", "trainer.run_name", "trainer.resume", "trainer.progress",
                  "trainer.plot", "trainer.async_checkpoints", "trainer.preemption_check_every", "trainer.log_every",
                  "trainer.eval_every", "trainer.checkpoint_every", "trainer.keep_last", "rollout.wait_for_weights_s",
                  "rollout.heartbeat_s", "rollout.worker_timeout_s", "rollout.rollout_timeout_s")


def run_id(cfg: RLConfig) -> str:
  """`rl-<12 hex>`: a hash of the fields that differ from their defaults, without RUN_ID_IGNORES (the same for every
  job of one run, and across upgrades that add fields; `train.run_ids`)."""
  from jaxpod.train.run_ids import run_name
  return run_name(cfg, "rl", RUN_ID_IGNORES, ProblemSet.get_choice_name(type(cfg.problems)), choice="problems")


def run_dir(cfg: RLConfig) -> str:
  """The run folder (see the module docstring); one named by the hash rule before upgrades kept ids is resumed."""
  from jaxpod.train.run_ids import find_run, legacy_run_id
  runs = storage.absolute(cfg.trainer.runs_dir)
  if cfg.trainer.run_name:
    return storage.join(runs, cfg.trainer.run_name)
  kind = ProblemSet.get_choice_name(type(cfg.problems))
  return find_run(runs, run_id(cfg), legacy_run_id(cfg, "rl", RUN_ID_IGNORES, "rl", kind))


def run(cfg: RLConfig) -> dict | None:
  """Run `jaxpod rl` as configured; returns the summary on the leader of the trainer (else None)."""
  from jaxpod.rl import checks
  folder = run_dir(cfg)
  policy = policy_spec(cfg, folder)  # the run's one policy: every part below reads its tokenizer from it
  checks.before_jax(cfg, policy)  # invariant 7: everything that can fail does so here, in one line
  if cfg.topology == "disaggregated" and cfg.role == "auto":
    from jaxpod.rl.disaggregated.launch import run_clusters
    return run_clusters(cfg, folder)
  from jaxpod import runtime
  runtime.init(cfg.runtime, runs_dir=cfg.trainer.runs_dir)
  if cfg.role == "rollout":
    from jaxpod.rl.disaggregated.worker import run_worker
    with runtime.guard():
      run_worker(policy, verified_problems(cfg), cfg.rollout, num_generations=cfg.grpo.num_generations,
                 mesh=cfg.mesh, transfer=transfer_config(cfg, folder), run_dir=folder)
    return None
  with runtime.guard():
    return train_policy(cfg, folder, policy)


def train_policy(cfg: RLConfig, folder: str, policy: PolicySpec) -> dict | None:
  """Warm-up (unless model.hf), GRPO, summary; every host of the trainer job calls it."""
  import time
  from jaxpod import runtime
  from jaxpod.rl import summary as summary_lib
  from jaxpod.rl.grpo_task import GRPOTask
  from jaxpod.train.trainer import train
  t0 = time.monotonic()
  runtime.broadcast_call(lambda: storage.makedirs(folder), "rl.run_dir")
  warm = None
  if not cfg.model.hf and cfg.warmup.steps > 0:
    warm = train(warmup_config(cfg, folder, policy))
  t_warm = time.monotonic() - t0
  grpo = grpo_config(cfg, folder, policy)
  rl_summary = train(grpo, task=GRPOTask(grpo, batch_source(cfg, folder, policy)))
  out = None
  if runtime.is_leader():
    workers = None
    if cfg.topology == "disaggregated":
      from jaxpod.rl.disaggregated.queue import Queue
      workers = {str(w): rec for w, rec in Queue(folder).heartbeats().items()}
    out = summary_lib.write(cfg.topology, cfg.grpo.rows, folder, warm, rl_summary, warmup_s=t_warm,
                            wall_s=time.monotonic() - t0, workers=workers)
  runtime.barrier("rl.done", timeout_s=600)
  return out


def policy_spec(cfg: RLConfig, folder: str) -> PolicySpec:
  """The run's policy: the model section, starting from model.hf or the warm-up's export in `folder` (None: neither,
  random init), with `lora`'s adapters on that start (the warm-up itself trains every weight of a fresh model)."""
  return PolicySpec(cfg.model, start_url(cfg, folder), cfg.lora)


def start_url(cfg: RLConfig, folder: str) -> str | None:
  """The checkpoint GRPO starts from: model.hf, else the warm-up's export (None: neither, random init)."""
  if cfg.model.hf:
    return cfg.model.hf
  return storage.join(folder, "warmup", "hf") if cfg.warmup.steps > 0 else None


def verified_problems(cfg: RLConfig) -> VerifiedProblems:
  """The problems slice: the problem set (`problems`), its rewards, the run seed, the held-out evaluation."""
  return VerifiedProblems(cfg.problems, tuple(cfg.rewards), tuple(cfg.reward_weights), cfg.trainer.seed, cfg.eval)


def transfer_config(cfg: RLConfig, folder: str) -> TransferConfig:
  """The transport slice: `transfer` with a relative folder placed in the run folder."""
  from jaxpod.rl.disaggregated.publish import transfer_config as resolve
  return resolve(cfg.transfer, folder)


def batch_source(cfg: RLConfig, folder: str, policy: PolicySpec):
  """What the GRPO task trains from, by topology: this job's engine between steps (colocated), or the rollout
  queue the workers fill (disaggregated); every host of the trainer builds its own."""
  from jaxpod.rl.batch import Batcher
  batcher = Batcher(cfg.rollout.cache_len, policy.tokenizer.pad_id, cfg.grpo.scale_rewards, cfg.grpo.trim_rows)
  if cfg.topology == "colocated":
    from jaxpod.rl.colocated import BatchSlot
    return BatchSlot(verified_problems(cfg), policy, cfg.rollout, cfg.grpo, batcher)
  from jaxpod.rl.disaggregated.queue_source import QueueSource
  return QueueSource(folder, transfer_config(cfg, folder), cfg.grpo, cfg.rollout, batcher)


def warmup_config(cfg: RLConfig, folder: str, policy: PolicySpec):
  """The TrainConfig of the supervised warm-up (`<run>/warmup`, exported to `<run>/warmup/hf`)."""
  from jaxpod.policy.warmup import warmup_run
  return warmup_run(cfg.trainer, folder, policy, verified_problems(cfg), cfg.warmup, cfg.rollout,
                    runtime=cfg.runtime, mesh=cfg.mesh, tracker=cfg.tracker)


def grpo_config(cfg: RLConfig, folder: str, policy: PolicySpec):
  """The TrainConfig of the GRPO run (`<run>/train`, exported to `<run>/hf`); its task is `GRPOTask(config, source)`."""
  from jaxpod.rl.grpo_task import GRPOTaskConfig
  from jaxpod.train.config import DataConfig, TrainConfig
  trainer = dataclasses.replace(cfg.trainer, runs_dir=folder, run_name="train")
  rows = cfg.grpo.rows
  data = DataConfig(global_batch_size=rows, eval_batch_size=rows, seed=cfg.trainer.seed)
  task = GRPOTaskConfig(data=data, policy=policy, problems=verified_problems(cfg), grpo=cfg.grpo, rollout=cfg.rollout,
                        export_to=storage.join(folder, "hf") if cfg.export_hf else None)
  return TrainConfig(task=task, trainer=trainer, runtime=cfg.runtime, mesh=cfg.mesh, tracker=cfg.tracker)
