"""Training configuration: one frozen dataclass per component, validated in `__post_init__`.

`TrainConfig` nests runtime, mesh, task, trainer and tracker. `task:` is a draccus choice
type (`task: {type: trm_sudoku, data: ..., model: ..., optim: ...}`): each module of
`jaxpod.tasks` registers its config class under a name, and the trainer sees only
`TaskConfig` (a `data:` section with the batch sizes, `build`, `check`). Everything that can be
checked before JAX initialises (invariant 7) is checked by `validate_for_hosts`: the global
batch against the host count and the data-parallel size of the mesh, the mesh against the
device count. Errors name the field, the value received and the fix.
"""
from __future__ import annotations

import dataclasses
import math

from typing import ClassVar

import draccus

from jaxpod.runtime import HostInfo, MeshConfig, RuntimeConfig


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """What every task's `data:` section has (each task subclasses it with its own fields)."""

  global_batch_size: int = 32  # rows per training step over all hosts
  eval_batch_size: int = 300  # rows per evaluation step over all hosts (last batch padded)
  seed: int = 0  # data seed (generator, shuffle order)
  cache_dir: str | None = None  # root of prepared data, shared storage (None: $JAXPOD_DATA_CACHE, else <runs_dir>/../jaxpod_data)

  def __post_init__(self):
    for name in ("global_batch_size", "eval_batch_size"):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f"task.data.{name}={value!r}: expected a positive integer")


@dataclasses.dataclass(frozen=True)
class TaskConfig(draccus.PluginRegistry, discover_packages_path="jaxpod.tasks"):
  """A task's config section, `task: {type: NAME, ...}`; every module of `jaxpod.tasks` registers one.

  A subclass has a `data:` section (a `DataConfig`), its own model/optimizer/eval fields, and
  implements `build` (the `jaxpod.train.task.Task` the trainer runs) and `check` (validation that
  needs the trainer section). `prefix` names its run folders (`<prefix>-<config hash>`).
  """

  bar_metrics: tuple[str, ...] = ("loss",)  # training metrics the progress bar shows
  plot_metrics: tuple[str, ...] = ("loss",)  # panels of metrics.png: space-separated metric names per panel (eval/<name> drawn too)

  prefix: ClassVar[str] = "run"

  @classmethod
  def default_choice_name(cls) -> str | None:
    return DEFAULT_TASK

  def build(self, cfg: "TrainConfig"):
    """The `Task` object for this run (see jaxpod.train.task)."""
    raise NotImplementedError(f"{type(self).__name__}.build")

  def check(self, cfg: "TrainConfig") -> None:
    """Cross-section validation (e.g. against trainer.steps); ValueError naming the field and the fix."""

  def shared_urls(self) -> dict[str, str]:
    """{field: URL} of storage this task writes and every host reads (checked shared with several hosts)."""
    return {"task.data.cache_dir": self.data.cache_dir} if self.data.cache_dir else {}


DEFAULT_TASK = "trm_sudoku"  # `jaxpod train` with no task section


def default_task() -> TaskConfig:
  """The registered config class of DEFAULT_TASK, with its defaults."""
  return TaskConfig.get_choice_class(DEFAULT_TASK)()


def task_type(task: TaskConfig) -> str:
  """The registry name of a task config (`trm_sudoku`)."""
  return TaskConfig.get_choice_name(type(task))


@dataclasses.dataclass(frozen=True)
class TrainerConfig:
  """The loop: length, hook cadence, checkpoints, EMA, seeds, where the run folder goes."""

  steps: int = 400  # optimizer steps (one ACT step each)
  eval_every: int = 0  # evaluate every N steps (0: only at the end)
  eval_at_start: bool = False  # also evaluate the starting weights of a fresh run (logged at step 0)
  checkpoint_every: int = 0  # checkpoint every N steps (0: only at the end)
  keep_last: int = 2  # checkpoints kept on disk
  log_every: int = 10  # metrics to the tracker every N steps
  ema: float = 0.99  # EMA decay of the parameters evaluated and exported (0: no EMA, use the live weights)
  seed: int = 0  # model init and halting-exploration randomness
  runs_dir: str = "runs"  # parent of run folders: a local path (one host) or a bucket URL gs://...; caches are siblings
  run_name: str | None = None  # run folder name (None: '<task>-<hash of the config>', so a rerun continues the run)
  resume: str = "auto"  # auto: continue from the run's newest good checkpoint; never: refuse if it has one; or a checkpoint URL to start from
  async_checkpoints: bool = True  # write checkpoints in the background
  preemption_check_every: int = 10  # hosts compare SIGTERM notices every N steps (a KV round trip), then save and exit
  progress: bool = True  # rich progress bar on the leader
  plot: bool = True  # write metrics.png into the run folder at the end
  microbatches: int = 1  # gradient accumulation: each step's batch in this many microbatches, one update (train/step.py)

  def __post_init__(self):
    if not isinstance(self.steps, int) or self.steps < 1:
      raise ValueError(f"trainer.steps={self.steps!r}: expected a positive integer")
    if not isinstance(self.microbatches, int) or self.microbatches < 1:
      raise ValueError(f"trainer.microbatches={self.microbatches!r}: expected a positive integer (1: no accumulation)")
    if self.preemption_check_every < 1:
      raise ValueError(f"trainer.preemption_check_every={self.preemption_check_every}: expected >= 1")
    for name in ("eval_every", "checkpoint_every", "log_every"):
      if getattr(self, name) < 0:
        raise ValueError(f"trainer.{name}={getattr(self, name)}: expected >= 0 (0 disables the periodic call)")
    if self.keep_last < 1:
      raise ValueError(f"trainer.keep_last={self.keep_last}: keep at least 1 checkpoint")
    if not 0.0 <= self.ema < 1.0:
      raise ValueError(f"trainer.ema={self.ema}: expected a decay in [0, 1) (0 disables EMA)")
    if isinstance(self.resume, bool) or str(self.resume).lower() in ("true", "false"):  # the old boolean
      object.__setattr__(self, "resume", "auto" if str(self.resume).lower() == "true" else "never")
    if not self.resume:
      raise ValueError("trainer.resume is empty: expected auto, never or a checkpoint URL")


@dataclasses.dataclass(frozen=True)
class TrackerConfig:
  """Where metrics go. JSONL in the run folder always; the rest optional. Leader only."""

  tensorboard: bool = True  # TensorBoard events (tensorboardX) in <run>/tb
  wandb: bool = False  # Weights & Biases (imported only when enabled)
  wandb_project: str = "jaxpod"  # wandb project
  wandb_mode: str = "offline"  # "offline" works without network; "online" needs a login
  sync_every_s: float = 30.0  # a bucket run folder receives the staged metrics/events this often (and at checkpoints)

  def __post_init__(self):
    if self.wandb_mode not in ("offline", "online", "disabled"):
      raise ValueError(f"tracker.wandb_mode={self.wandb_mode!r}: expected offline, online or disabled")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """A whole training run: the generic sections and one `task:` (default: TRM on 4x4 Sudoku, `jaxpod train`)."""

  runtime: RuntimeConfig = dataclasses.field(default_factory=RuntimeConfig)
  mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
  task: TaskConfig = dataclasses.field(default_factory=default_task)  # `type:` picks the task (jaxpod.tasks)
  trainer: TrainerConfig = dataclasses.field(default_factory=TrainerConfig)
  tracker: TrackerConfig = dataclasses.field(default_factory=TrackerConfig)

  def __post_init__(self):
    self.task.check(self)


# Fields that do not change what a run computes: a rerun that differs only in them is the same run.
# trainer.steps is among them so that `--trainer.steps` higher continues a finished run.
RUN_ID_IGNORES = ("runtime", "mesh", "tracker", "trainer.steps", "trainer.runs_dir", "trainer.run_name",
                  "trainer.resume", "trainer.progress", "trainer.plot", "trainer.async_checkpoints",
                  "trainer.preemption_check_every",
                  "trainer.log_every", "trainer.eval_every", "trainer.eval_at_start", "trainer.checkpoint_every", "trainer.keep_last",
                  "task.data.cache_dir", "task.data.eval_batch_size", "task.bar_metrics", "task.plot_metrics")


def run_id(cfg: TrainConfig, prefix: str) -> str:
  """`<prefix>-<12 hex>`: a hash of the fields that differ from their defaults, without RUN_ID_IGNORES (the same
  for the same command, across upgrades that add fields; `train.run_ids`)."""
  from jaxpod.train.run_ids import run_name
  return run_name(cfg, prefix, RUN_ID_IGNORES, task_type(cfg.task))


def legacy_run_id(cfg: TrainConfig, prefix: str) -> str | None:
  """The name the run-id rule before `run_id`'s gave this command's folder (a run to resume), or None."""
  from jaxpod.train.run_ids import legacy_run_id as legacy
  return legacy(cfg, prefix, RUN_ID_IGNORES, "train", task_type(cfg.task))


def validate_storage(cfg: TrainConfig, hosts: HostInfo) -> None:
  """Invariants 7 and 8 for storage, before JAX initialises: the runs folder (and the dataset cache, the
  resume URL) can be reached, and with several hosts they are shared storage. One-line StorageError."""
  from jaxpod.runtime import storage
  storage.check_url(cfg.trainer.runs_dir, "trainer.runs_dir")
  storage.check_shared(cfg.trainer.runs_dir, "trainer.runs_dir", hosts.process_count)
  for field, url in cfg.task.shared_urls().items():
    storage.check_shared(url, field, hosts.process_count)
  if cfg.trainer.resume not in ("auto", "never"):
    storage.check_url(cfg.trainer.resume, "trainer.resume")
    if not storage.exists(cfg.trainer.resume):
      raise storage.StorageError(f"trainer.resume={cfg.trainer.resume}: no such checkpoint folder; give a run "
                                 "folder or its checkpoints/ folder, or use auto")


def validate_for_hosts(cfg: TrainConfig, hosts: HostInfo, num_devices: int | None = None) -> None:
  """Invariant 7: batch vs hosts and data-parallel size, mesh vs devices; before JAX initialises.

  `num_devices` is the global device count when known (after init, or hosts x devices_per_host
  in a simulation); without it the mesh checks wait until the devices exist.
  """
  if num_devices is None and hosts.devices_per_host is not None:
    num_devices = hosts.process_count * hosts.devices_per_host
  for name in ("global_batch_size", "eval_batch_size"):
    value = getattr(cfg.task.data, name)
    if value % hosts.process_count:
      raise ValueError(f"task.data.{name}={value} is not divisible by the {hosts.process_count} hosts; "
                       f"use a multiple of {hosts.process_count} (each host loads an equal share)")
  k = cfg.trainer.microbatches
  if cfg.task.data.global_batch_size % (k * hosts.process_count):
    raise ValueError(f"trainer.microbatches={k} does not divide each host's {cfg.task.data.global_batch_size} / "
                     f"{hosts.process_count} rows of task.data.global_batch_size; use a divisor of them")
  if num_devices is None:
    return
  if num_devices % hosts.process_count:
    raise ValueError(f"{num_devices} devices do not split over {hosts.process_count} hosts")
  try:
    dp = cfg.mesh.data_parallel_size(num_devices)
  except ValueError as e:
    raise ValueError(f"mesh: {e}") from None
  for name in ("global_batch_size", "eval_batch_size"):
    value = getattr(cfg.task.data, name)
    if value % dp:
      lcm = math.lcm(dp, hosts.process_count)
      raise ValueError(f"task.data.{name}={value} is not divisible by the data-parallel size {dp} "
                       f"(mesh data*fsdp over {num_devices} devices); use a multiple of {lcm}")
  rows = cfg.task.data.global_batch_size // dp  # each data-parallel shard's rows, split in k microbatches
  if rows % k:
    raise ValueError(f"trainer.microbatches={k} does not divide the {rows} rows per data-parallel shard of "
                     f"task.data.global_batch_size={cfg.task.data.global_batch_size}; use a divisor of {rows}")
