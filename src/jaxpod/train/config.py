"""Training configuration: one frozen dataclass per component, validated in `__post_init__`.

`TrainConfig` nests runtime, mesh, data, model, optim, trainer and tracker. Everything that
can be checked before JAX initialises (invariant 7) is checked by `validate_for_hosts`:
the global batch against the host count and the data-parallel size of the mesh, the mesh
against the device count, the model against the grid it must read. Errors name the field,
the value received and the fix.
"""
from __future__ import annotations

import dataclasses
import math

from jaxpod.models.llama.config import LlamaConfig
from jaxpod.models.trm import TRMConfig, TRMOptimConfig
from jaxpod.runtime import HostInfo, MeshConfig, RuntimeConfig


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """The Sudoku dataset: generated into a cache folder (box/num_*) or read from `path`."""

  path: str | None = None  # an existing dataset in the reference on-disk format; None: generate one
  box: str = "2x2"  # box shape of generated puzzles: 2x2 -> 4x4 grid, 2x3 -> 6x6, 3x3 -> 9x9
  num_train: int = 500  # generated training puzzles (before augmentation)
  num_test: int = 300  # generated held-out test puzzles (never augmented, never seen in training)
  augmentations: int = 8  # augmented copies per training puzzle (0: originals only)
  clues: int | None = None  # clue target of the generator (None: its default for the grid)
  seed: int = 0  # generator seed (puzzles) and loader seed (shuffle order)
  cache_dir: str | None = None  # root of generated datasets, shared storage (None: $JAXPOD_DATA_CACHE, else <runs_dir>/../jaxpod_data)
  global_batch_size: int = 32  # rows per training step over all hosts
  eval_batch_size: int = 300  # rows per evaluation step over all hosts (last batch padded)

  def __post_init__(self):
    for name in ("num_train", "num_test", "global_batch_size", "eval_batch_size"):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f"data.{name}={value!r}: expected a positive integer")
    if self.augmentations < 0:
      raise ValueError(f"data.augmentations={self.augmentations}: expected >= 0")
    parts = str(self.box).lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
      raise ValueError(f"data.box={self.box!r}: expected 'RxC' such as '2x2', '2x3' or '3x3'")

  @property
  def side(self) -> int:
    """Grid side n (4 for box 2x2)."""
    r, c = (int(p) for p in str(self.box).lower().split("x"))
    return r * c


@dataclasses.dataclass(frozen=True)
class TrainerConfig:
  """The loop: length, hook cadence, checkpoints, EMA, seeds, where the run folder goes."""

  steps: int = 400  # optimizer steps (one ACT step each)
  eval_every: int = 0  # evaluate every N steps (0: only at the end)
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

  def __post_init__(self):
    if not isinstance(self.steps, int) or self.steps < 1:
      raise ValueError(f"trainer.steps={self.steps!r}: expected a positive integer")
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


def _default_lm_model() -> LlamaConfig:
  return LlamaConfig(vocab_size=259, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                     num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
                     tie_word_embeddings=True, bos_token_id=256, eos_token_id=(257,), pad_token_id=258)


@dataclasses.dataclass(frozen=True)
class LMConfig:
  """The causal-LM task: a Llama on a text file, next-token loss, samples during training.

  Uses `data.global_batch_size`, `data.eval_batch_size` and `data.seed` (shuffle order) from `data:`.
  """

  text_path: str | None = None  # a UTF-8 text file (one document per line); None: the built-in toy-grammar text
  text_chars: int = 300_000  # size of the built-in text (ignored with text_path)
  tokenizer: str = "byte"  # "byte" (ids 0..255, BOS 256, EOS 257, PAD 258) or a folder with tokenizer.json
  seq_len: int = 128  # tokens per training row
  eval_fraction: float = 0.05  # share of the rows held out for eval loss / perplexity
  model: LlamaConfig = dataclasses.field(default_factory=_default_lm_model)
  lr: float = 3e-3  # AdamW peak learning rate
  warmup_steps: int = 50  # linear warmup from 0
  lr_min_ratio: float = 0.1  # cosine decay to lr * lr_min_ratio at trainer.steps
  weight_decay: float = 0.01  # AdamW decoupled weight decay
  grad_clip: float = 1.0  # global-norm clip (0: none)
  sample_every: int = 0  # SampleHook cadence in steps (0: only at the end; no prompts: no sampling)
  prompts: tuple[str, ...] = ()  # prompts completed by SampleHook into <run>/samples.jsonl
  sample_max_new_tokens: int = 64  # tokens generated per prompt
  sample_max_prompt_len: int = 64  # longest prompt in tokens (static shape of the sampler)
  sample_temperature: float = 0.0  # 0: greedy

  def __post_init__(self):
    for name in ("seq_len", "text_chars", "sample_max_new_tokens", "sample_max_prompt_len"):
      if getattr(self, name) < 1:
        raise ValueError(f"lm.{name}={getattr(self, name)}: expected a positive integer")
    if self.seq_len > self.model.max_position_embeddings:
      raise ValueError(f"lm.seq_len={self.seq_len} exceeds lm.model.max_position_embeddings="
                       f"{self.model.max_position_embeddings}; lower seq_len or raise max_position_embeddings")
    if self.sample_max_prompt_len + self.sample_max_new_tokens > self.model.max_position_embeddings:
      raise ValueError(f"lm.sample_max_prompt_len + lm.sample_max_new_tokens = "
                       f"{self.sample_max_prompt_len + self.sample_max_new_tokens} exceeds "
                       f"lm.model.max_position_embeddings={self.model.max_position_embeddings}; lower one of them")
    if not 0.0 < self.eval_fraction < 1.0:
      raise ValueError(f"lm.eval_fraction={self.eval_fraction}: expected a value in (0, 1)")
    if self.lr <= 0 or self.warmup_steps < 0 or self.weight_decay < 0 or self.grad_clip < 0:
      raise ValueError("lm.lr must be > 0 and lm.warmup_steps, lm.weight_decay, lm.grad_clip >= 0")
    if not 0.0 <= self.lr_min_ratio <= 1.0:
      raise ValueError(f"lm.lr_min_ratio={self.lr_min_ratio}: expected a value in [0, 1]")
    if self.sample_every < 0:
      raise ValueError(f"lm.sample_every={self.sample_every}: expected >= 0 (0: only at the end)")
    if self.tokenizer == "byte" and self.model.vocab_size < 259:
      raise ValueError(f"lm.model.vocab_size={self.model.vocab_size} is too small for the byte tokenizer; "
                       "set it to at least 259")


def _default_optim() -> TRMOptimConfig:
  return TRMOptimConfig(lr=3e-3, puzzle_emb_lr=3e-3, weight_decay=0.03, puzzle_emb_weight_decay=0.1, warmup_steps=100)


def _default_model() -> TRMConfig:
  return TRMConfig(seq_len=16, vocab_size=6, hidden_size=64, num_heads=4, puzzle_emb_ndim=64, puzzle_emb_len=1,
                   h_cycles=2, l_cycles=2, mlp_t=True, pos_encodings="none", halt_max_steps=4,
                   loss_type="softmax_cross_entropy")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """A whole training run. The defaults are `jaxpod train`'s embedded config (4x4 Sudoku, small TRM).

  With `lm:` set the run is the causal-LM task instead (`jaxpod.train.lm_task`).
  """

  runtime: RuntimeConfig = dataclasses.field(default_factory=RuntimeConfig)
  mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
  data: DataConfig = dataclasses.field(default_factory=DataConfig)
  model: TRMConfig = dataclasses.field(default_factory=_default_model)
  optim: TRMOptimConfig = dataclasses.field(default_factory=_default_optim)
  trainer: TrainerConfig = dataclasses.field(default_factory=TrainerConfig)
  tracker: TrackerConfig = dataclasses.field(default_factory=TrackerConfig)
  lm: LMConfig | None = None  # set: the causal-LM task (model/optim/Sudoku data fields unused); None: TRM Sudoku

  def __post_init__(self):
    if self.lm is not None:
      if self.lm.warmup_steps >= self.trainer.steps:
        raise ValueError(f"lm.warmup_steps={self.lm.warmup_steps} must be below trainer.steps={self.trainer.steps}")
      return
    if self.data.path is None:  # a generated grid: the model must read exactly it
      n = self.data.side
      if self.model.seq_len != n * n:
        raise ValueError(f"model.seq_len={self.model.seq_len} does not match data.box={self.data.box} "
                         f"({n}x{n} grid); set model.seq_len={n * n}")
      if self.model.vocab_size != n + 2:
        raise ValueError(f"model.vocab_size={self.model.vocab_size} does not match data.box={self.data.box}; "
                         f"set model.vocab_size={n + 2} (pad, blank and {n} digits)")
    if self.data.path is None and self.data.global_batch_size > self.data.num_train:
      raise ValueError(f"data.global_batch_size={self.data.global_batch_size} exceeds data.num_train="
                       f"{self.data.num_train} (an epoch draws one example per training puzzle); lower the batch "
                       "or raise num_train")
    if self.optim.lr_min_ratio < 1.0 and self.optim.total_steps > self.trainer.steps:
      raise ValueError(f"optim.total_steps={self.optim.total_steps} exceeds trainer.steps={self.trainer.steps}; "
                       "the cosine would never finish")


# Fields that do not change what a run computes: a rerun that differs only in them is the same run.
# trainer.steps is among them so that `--trainer.steps` higher continues a finished run.
RUN_ID_IGNORES = ("runtime", "mesh", "tracker", "trainer.steps", "trainer.runs_dir", "trainer.run_name",
                  "trainer.resume", "trainer.progress", "trainer.plot", "trainer.async_checkpoints",
                  "trainer.preemption_check_every",
                  "trainer.log_every", "trainer.eval_every", "trainer.checkpoint_every", "trainer.keep_last",
                  "data.cache_dir", "data.eval_batch_size")


def run_id(cfg: TrainConfig, prefix: str) -> str:
  """`<prefix>-<12 hex>`: a hash of the config without RUN_ID_IGNORES, the same for the same command."""
  import hashlib
  import json
  tree = json.loads(json.dumps(dataclasses.asdict(cfg), default=str))
  for dotted in RUN_ID_IGNORES:
    *parents, leaf = dotted.split(".")
    node = tree
    for p in parents:
      node = node.get(p, {})
    node.pop(leaf, None)
  digest = hashlib.sha256(json.dumps(tree, sort_keys=True).encode()).hexdigest()[:12]
  return f"{prefix}-{digest}"


def validate_storage(cfg: TrainConfig, hosts: HostInfo) -> None:
  """Invariants 7 and 8 for storage, before JAX initialises: the runs folder (and the dataset cache, the
  resume URL) can be reached, and with several hosts they are shared storage. One-line StorageError."""
  from jaxpod.runtime import storage
  storage.check_url(cfg.trainer.runs_dir, "trainer.runs_dir")
  storage.check_shared(cfg.trainer.runs_dir, "trainer.runs_dir", hosts.process_count)
  if cfg.lm is None and cfg.data.path is None and cfg.data.cache_dir:
    storage.check_shared(cfg.data.cache_dir, "data.cache_dir", hosts.process_count)
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
    value = getattr(cfg.data, name)
    if value % hosts.process_count:
      raise ValueError(f"data.{name}={value} is not divisible by the {hosts.process_count} hosts; "
                       f"use a multiple of {hosts.process_count} (each host loads an equal share)")
  if num_devices is None:
    return
  if num_devices % hosts.process_count:
    raise ValueError(f"{num_devices} devices do not split over {hosts.process_count} hosts")
  try:
    dp = cfg.mesh.data_parallel_size(num_devices)
  except ValueError as e:
    raise ValueError(f"mesh: {e}") from None
  for name in ("global_batch_size", "eval_batch_size"):
    value = getattr(cfg.data, name)
    if value % dp:
      lcm = math.lcm(dp, hosts.process_count)
      raise ValueError(f"data.{name}={value} is not divisible by the data-parallel size {dp} "
                       f"(mesh data*fsdp over {num_devices} devices); use a multiple of {lcm}")


def from_trm_yaml(path: str) -> dict | None:
  """A TRM model file (`model:`, `optim:`, reference-style `train:`) as TrainConfig YAML sections; None otherwise.

  `train.epochs` counts reference epochs of one example per training puzzle, so
  steps = epochs * data.num_train / global_batch_size (the paper's 50,000 epochs of 1000
  puzzles at batch 768: 65,104 steps). The grid follows from `model.seq_len`.
  """
  import yaml
  with open(path) as f:
    raw = yaml.safe_load(f) or {}
  if not isinstance(raw, dict) or "train" not in raw or "trainer" in raw:
    return None
  train = dict(raw.pop("train") or {})
  model = raw.get("model", {})
  side = math.isqrt(int(model.get("seq_len", 81)))
  rows = max(d for d in range(1, math.isqrt(side) + 1) if side % d == 0)
  data = dict(raw.pop("data", {}) or {})
  data.setdefault("box", f"{rows}x{side // rows}")
  if side == 9:  # the paper's shape: 1000 puzzles x 1000 augmentations, 1000 held out
    for k, v in (("num_train", 1000), ("num_test", 1000), ("augmentations", 1000)):
      data.setdefault(k, v)
  batch = int(train.pop("global_batch_size", DataConfig.global_batch_size))
  data["global_batch_size"] = batch
  data.setdefault("eval_batch_size", batch)
  per_epoch = data.get("num_train", DataConfig.num_train) / batch
  trainer = {}
  if "epochs" in train:
    trainer["steps"] = max(1, math.ceil(train.pop("epochs") * per_epoch))
  if "eval_interval" in train:
    trainer["eval_every"] = max(1, math.ceil(train.pop("eval_interval") * per_epoch))
    trainer["checkpoint_every"] = trainer["eval_every"]
  if "ema" in train:
    trainer["ema"] = float(train.pop("ema"))
  if train:
    raise ValueError(f"{path}: unknown keys {sorted(train)} in `train:`; known: global_batch_size, epochs, "
                     "eval_interval, ema")
  return {**raw, "data": data, "trainer": trainer}
