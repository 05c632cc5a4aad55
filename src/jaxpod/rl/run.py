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
only its own: the policy (`PolicySpec`), the problems and rewards (`VerifiedProblems`), `GRPOConfig`, the
engine's sampling options (`RolloutConfig`, a `jaxpod.sample.SamplingOptions`), the queue (the run
folder) and the transport (`TransferConfig`, its folder resolved in the run folder). The topology is
decided here: the GRPO task is handed the batch source it trains from (`batch_source`).
"""
from __future__ import annotations

import dataclasses

from jaxpod.problems import ProblemSet
from jaxpod.problems.rewards import VerifiedProblems
from jaxpod.rl.config import RLConfig
from jaxpod.rl.policy import PolicySpec
from jaxpod.runtime import storage
from jaxpod.transfer.config import TransferConfig
from jaxpod.runtime.log import get_logger

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
  return run_name(cfg, "rl", RUN_ID_IGNORES, ProblemSet.get_choice_name(type(cfg.task)))


def run_dir(cfg: RLConfig) -> str:
  """The run folder (see the module docstring); one named by the hash rule before upgrades kept ids is resumed."""
  from jaxpod.train.run_ids import find_run, legacy_run_id
  runs = storage.absolute(cfg.trainer.runs_dir)
  if cfg.trainer.run_name:
    return storage.join(runs, cfg.trainer.run_name)
  kind = ProblemSet.get_choice_name(type(cfg.task))
  return find_run(runs, run_id(cfg), legacy_run_id(cfg, "rl", RUN_ID_IGNORES, "rl", kind))


def run(cfg: RLConfig) -> dict | None:
  """Run `jaxpod rl` as configured; returns the summary on the leader of the trainer (else None)."""
  from jaxpod.rl import checks
  checks.before_jax(cfg)  # invariant 7: everything that can fail does so here, in one line
  folder = run_dir(cfg)
  if cfg.topology == "disaggregated" and cfg.role == "auto":
    from jaxpod.rl.disaggregated.launch import run_clusters
    return run_clusters(cfg, folder)
  from jaxpod import runtime
  runtime.init(cfg.runtime, runs_dir=cfg.trainer.runs_dir)
  if cfg.role == "rollout":
    from jaxpod.rl.disaggregated.worker import run_worker
    with runtime.guard():
      run_worker(policy_spec(cfg, cfg.model.hf or None, base=start_url(cfg, folder)), verified_problems(cfg),
                 cfg.rollout, num_generations=cfg.grpo.num_generations, mesh=cfg.mesh,
                 transfer=transfer_config(cfg, folder), run_dir=folder)
    return None
  with runtime.guard():
    return train_policy(cfg, folder)


def train_policy(cfg: RLConfig, folder: str) -> dict | None:
  """Warm-up (unless model.hf), GRPO, summary; every host of the trainer job calls it."""
  import time
  from jaxpod import runtime
  from jaxpod.rl import summary as summary_lib
  from jaxpod.train.trainer import train
  t0 = time.monotonic()
  runtime.broadcast_call(lambda: storage.makedirs(folder), "rl.run_dir")
  start = cfg.model.hf or None
  warm = None
  if not start and cfg.warmup.steps > 0:
    warm = train(warmup_config(cfg, folder))
    start = storage.join(folder, "warmup", "hf")
  t_warm = time.monotonic() - t0
  rl_summary = train(grpo_config(cfg, folder, start, batch_source(cfg, folder, start)))
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


def policy_spec(cfg: RLConfig, start_from: str | None, base: str | None = None) -> PolicySpec:
  """The policy slice: the model section, starting from `start_from` (None: random init); with `lora`, adapters on
  the frozen `base` (default start_from; the warm-up, which starts from None, trains every weight)."""
  base = base or start_from
  lora = cfg.lora if base else None
  return PolicySpec(cfg.model, start_from, lora, base if lora else None)


def start_url(cfg: RLConfig, folder: str) -> str | None:
  """The checkpoint GRPO starts from: model.hf, else the warm-up's export (None: neither, random init)."""
  if cfg.model.hf:
    return cfg.model.hf
  return storage.join(folder, "warmup", "hf") if cfg.warmup.steps > 0 else None


def verified_problems(cfg: RLConfig) -> VerifiedProblems:
  """The problems slice: the problem set (`task`), its rewards, the run seed, the held-out evaluation."""
  return VerifiedProblems(cfg.task, tuple(cfg.rewards), tuple(cfg.reward_weights), cfg.trainer.seed, cfg.eval)


def transfer_config(cfg: RLConfig, folder: str) -> TransferConfig:
  """The transport slice: `transfer` with a relative folder placed in the run folder."""
  from jaxpod.rl.disaggregated.publish import transfer_config as resolve
  return resolve(cfg.transfer, folder)


def batch_source(cfg: RLConfig, folder: str, start_from: str | None):
  """What the GRPO task trains from, by topology: this job's engine between steps (colocated), or the rollout
  queue the workers fill (disaggregated); every host of the trainer builds its own."""
  from jaxpod.rl.rollout.groups import Batcher
  policy = policy_spec(cfg, start_from)
  batcher = Batcher(cfg.rollout.max_prompt_len + cfg.rollout.max_new_tokens, policy.tokenizer().pad_id,
                    cfg.grpo.scale_rewards, cfg.grpo.trim_rows)
  if cfg.topology == "colocated":
    from jaxpod.rl.colocated import RolloutBuffer
    return RolloutBuffer(verified_problems(cfg), policy, cfg.rollout, cfg.grpo, batcher)
  from jaxpod.rl.disaggregated.queue_source import QueueSource
  return QueueSource(folder, transfer_config(cfg, folder), cfg.grpo, cfg.rollout, batcher)


def _trainer_cfg(cfg: RLConfig, folder: str, name: str, **changes):
  from jaxpod.train.config import TrainConfig
  trainer = dataclasses.replace(cfg.trainer, runs_dir=folder, run_name=name, **changes)
  return trainer, dict(runtime=cfg.runtime, mesh=cfg.mesh, tracker=cfg.tracker), TrainConfig


def warmup_config(cfg: RLConfig, folder: str):
  """The TrainConfig of the supervised warm-up (`<run>/warmup`, exported to `<run>/warmup/hf`)."""
  from jaxpod.rl.train_tasks import warmup_run
  return warmup_run(cfg.trainer, folder, policy_spec(cfg, None), verified_problems(cfg), cfg.warmup, cfg.rollout,
                    runtime=cfg.runtime, mesh=cfg.mesh, tracker=cfg.tracker)


def grpo_config(cfg: RLConfig, folder: str, start_from: str | None, source):
  """The TrainConfig of the GRPO run (`<run>/train`, exported to `<run>/hf`), training from `source`."""
  from jaxpod.rl.train_tasks import GRPOTaskConfig
  from jaxpod.train.config import DataConfig
  trainer, common, TrainConfig = _trainer_cfg(cfg, folder, "train")
  rows = cfg.grpo.rows
  data = DataConfig(global_batch_size=rows, eval_batch_size=rows, seed=cfg.trainer.seed)
  task = GRPOTaskConfig(data=data, policy=policy_spec(cfg, start_from), problems=verified_problems(cfg), grpo=cfg.grpo,
                        rollout=cfg.rollout, source=source,
                        export_to=storage.join(folder, "hf") if cfg.export_hf else None)
  return TrainConfig(task=task, trainer=trainer, **common)
