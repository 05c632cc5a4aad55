"""`trm_sudoku`: TRM on Sudoku for the one trainer (the default task of `jaxpod train`).

    task:
      type: trm_sudoku
      data: {box: "2x2", num_train: 500, global_batch_size: 32, ...}   # SudokuData
      model: {hidden_size: 64, ...}                                   # jaxpod.models.trm.TRMConfig
      optim: {lr: 0.003, ...}                                         # jaxpod.models.trm.TRMOptimConfig

- Data: the leader generates the dataset into the shared cache (`jaxpod.data.sudoku`; held-out
  test puzzles are never augmentations of training puzzles) or checks `data.path`; every host
  builds its `SudokuLoader` (the same global batches for any host count).
- Step: one ACT step per optimizer step; the ACT carry persists across steps in the state.
- Metrics: what the reference logs (losses / global batch, halted-row metrics / halted count).
- Eval: `trm_eval.Evaluator`, the full test set with the EMA weights, exact and cell accuracy.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable

from jaxpod.models.trm import TRMConfig, TRMOptimConfig
from jaxpod.train.config import DataConfig, TaskConfig, TrainConfig


@dataclasses.dataclass(frozen=True)
class SudokuData(DataConfig):
  """The Sudoku dataset: generated into the cache folder (box/num_*) or read from `path`."""

  path: str | None = None  # an existing dataset in the reference on-disk format; None: generate one
  box: str = "2x2"  # box shape of generated puzzles: 2x2 -> 4x4 grid, 2x3 -> 6x6, 3x3 -> 9x9
  num_train: int = 500  # generated training puzzles (before augmentation)
  num_test: int = 300  # generated held-out test puzzles (never augmented, never seen in training)
  augmentations: int = 8  # augmented copies per training puzzle (0: originals only)
  clues: int | None = None  # clue target of the generator (None: its default for the grid)

  def __post_init__(self):
    super().__post_init__()
    for name in ("num_train", "num_test"):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f"task.data.{name}={value!r}: expected a positive integer")
    if self.augmentations < 0:
      raise ValueError(f"task.data.augmentations={self.augmentations}: expected >= 0")
    parts = str(self.box).lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
      raise ValueError(f"task.data.box={self.box!r}: expected 'RxC' such as '2x2', '2x3' or '3x3'")

  @property
  def side(self) -> int:
    """Grid side n (4 for box 2x2)."""
    r, c = (int(p) for p in str(self.box).lower().split("x"))
    return r * c


def _default_optim() -> TRMOptimConfig:
  return TRMOptimConfig(lr=3e-3, puzzle_emb_lr=3e-3, weight_decay=0.03, puzzle_emb_weight_decay=0.1, warmup_steps=100)


def _default_model() -> TRMConfig:
  return TRMConfig(seq_len=16, vocab_size=6, hidden_size=64, num_heads=4, puzzle_emb_ndim=64, puzzle_emb_len=1,
                   h_cycles=2, l_cycles=2, mlp_t=True, pos_encodings="none", halt_max_steps=4,
                   loss_type="softmax_cross_entropy")


@TaskConfig.register_subclass("trm_sudoku")
@dataclasses.dataclass(frozen=True)
class TrmSudokuConfig(TaskConfig):
  """TRM on Sudoku; the defaults are `jaxpod train`'s embedded config (4x4 grid, small TRM)."""

  bar_metrics: tuple[str, ...] = ("loss", "exact_accuracy")  # exact accuracy of the halted rows
  plot_metrics: tuple[str, ...] = ("loss lm_loss", "exact_accuracy accuracy")
  data: SudokuData = dataclasses.field(default_factory=SudokuData)
  model: TRMConfig = dataclasses.field(default_factory=_default_model)
  optim: TRMOptimConfig = dataclasses.field(default_factory=_default_optim)

  prefix = "trm"

  def build(self, cfg: TrainConfig) -> "SudokuTask":
    return SudokuTask(cfg)

  def check(self, cfg: TrainConfig) -> None:
    if self.data.path is None:  # a generated grid: the model must read exactly it
      n = self.data.side
      if self.model.seq_len != n * n:
        raise ValueError(f"task.model.seq_len={self.model.seq_len} does not match task.data.box={self.data.box} "
                         f"({n}x{n} grid); set task.model.seq_len={n * n}")
      if self.model.vocab_size != n + 2:
        raise ValueError(f"task.model.vocab_size={self.model.vocab_size} does not match task.data.box="
                         f"{self.data.box}; set task.model.vocab_size={n + 2} (pad, blank and {n} digits)")
      if self.data.global_batch_size > self.data.num_train:
        raise ValueError(f"task.data.global_batch_size={self.data.global_batch_size} exceeds task.data.num_train="
                         f"{self.data.num_train} (an epoch draws one example per training puzzle); lower the batch "
                         "or raise num_train")
    if self.optim.lr_min_ratio < 1.0 and self.optim.total_steps > cfg.trainer.steps:
      raise ValueError(f"task.optim.total_steps={self.optim.total_steps} exceeds trainer.steps={cfg.trainer.steps}; "
                       "the cosine would never finish")

  def shared_urls(self) -> dict[str, str]:
    return super().shared_urls() if self.data.path is None else {}  # a given dataset is only read


HALTED_ROW_METRICS = ("accuracy", "exact_accuracy", "q_halt_accuracy", "steps")


def normalize(raw: dict, global_batch_size: int) -> dict:
  """What the reference logs: losses / global batch, halted-row metrics / halted count."""
  from jaxpod.models import trm
  extra = {k: raw[k] for k in ("lr", "grad_norm") if k in raw}
  out = trm.normalize_metrics({k: v for k, v in raw.items() if k not in extra}, global_batch_size)
  out["count"] = raw["count"]
  if not raw["count"]:  # no row halted this step: halted-row metrics are undefined, not zero
    for k in HALTED_ROW_METRICS:
      out.pop(k, None)
  out.update(extra)
  return out


class SudokuTask:
  """TRM on Sudoku: ACT carry across steps, AdamATan2 + SignSGD, exact-accuracy eval."""

  name = TrmSudokuConfig.prefix
  headline = "exact_accuracy"  # the eval metric logged first
  batch_ndims = {"inputs": 2, "labels": 2, "puzzle_identifiers": 1}

  def __init__(self, cfg: TrainConfig):
    self.cfg, self.task = cfg, cfg.task
    self.loader = None

  def prepare(self) -> str:
    """Leader: the dataset folder (`data.path`, or generated into the shared cache if missing)."""
    from jaxpod.runtime import storage
    from jaxpod.train.data import cache_root
    d = self.task.data
    if d.path:
      if not storage.exists(storage.join(d.path, "train", "dataset.json")):
        raise FileNotFoundError(f"task.data.path={d.path}: no train/dataset.json there; point it at a dataset folder")
      return storage.absolute(d.path)
    from jaxpod.data.sudoku import SudokuDataConfig, ensure_dataset
    build = SudokuDataConfig(box=d.box, train=d.num_train, test=d.num_test, aug=d.augmentations, seed=d.seed,
                             clues=d.clues)
    return ensure_dataset(build, cache_root(d, self.cfg.trainer.runs_dir))

  def setup(self, prepared: str, host_index: int, host_count: int) -> None:
    from jaxpod.data.sudoku import SudokuLoader
    d = self.task.data
    self.data_path = prepared
    self.loader = SudokuLoader(prepared, d.global_batch_size, seed=d.seed, shard_index=host_index,
                               shard_count=host_count, eval_batch_size=d.eval_batch_size)
    meta, model = self.loader.metadata, self.task.model
    for field, key in (("seq_len", "seq_len"), ("vocab_size", "vocab_size")):
      if getattr(model, field) != meta[key]:
        raise ValueError(f"task.model.{field}={getattr(model, field)} but the dataset has {key}={meta[key]}; "
                         f"set task.model.{field}={meta[key]}")
    if model.num_puzzle_identifiers < meta["num_puzzle_identifiers"]:
      raise ValueError(f"task.model.num_puzzle_identifiers={model.num_puzzle_identifiers} < the dataset's "
                       f"{meta['num_puzzle_identifiers']}")

  def abstract_model(self, seed: int):
    from flax import nnx
    from jaxpod.models import trm
    return trm.split_model(nnx.eval_shape(lambda: trm.TRM(self.task.model, rngs=nnx.Rngs(seed))))

  def init_model(self, seed: int):
    from flax import nnx
    from jaxpod.models import trm
    _, params, buffers = trm.split_model(trm.TRM(self.task.model, rngs=nnx.Rngs(seed)))
    return params, buffers

  def init_carry(self, global_batch: int):
    from jaxpod.models import trm
    return trm.init_carry(self.task.model, global_batch)

  def optimizer(self):
    from jaxpod.models import trm
    o = self.task.optim
    return trm.make_optimizer(o), trm.warmup_schedule(o.lr, o.warmup_steps, o.total_steps, o.lr_min_ratio)

  def loss_fn(self, graphdef) -> Callable:
    from jaxpod.models import trm
    loss_type = self.task.model.loss_type

    def loss(params, buffers, batch, rng, carry):
      value, (carry, _, metrics) = trm.train_loss(graphdef, params, buffers, carry, batch, rng, loss_type)
      return value, (carry, metrics)

    return loss

  def normalize(self, raw: dict, global_batch: int) -> dict:
    return normalize(raw, global_batch)

  def train_iter(self):
    return self.loader.train_iter()

  def evaluator(self, graphdef, mesh, ema_sh, buffer_sh, batch_sh):
    from jaxpod.tasks.trm_eval import Evaluator
    return Evaluator(graphdef, self.task.model, mesh, ema_sh, buffer_sh, batch_sh, self.loader.eval_iter)

  def hooks(self, graphdef, mesh, tcfg) -> list:
    return []

  def eval_summary(self, ev: dict) -> list[tuple[str, str]]:
    return [("eval exact accuracy", f"{ev.get('exact_accuracy', float('nan')):.4f} on {ev.get('count', 0)} "
                                    "held-out puzzles (EMA weights)"),
            ("eval cell accuracy", f"{ev.get('accuracy', float('nan')):.4f}")]


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
  batch = int(train.pop("global_batch_size", SudokuData.global_batch_size))
  data["global_batch_size"] = batch
  data.setdefault("eval_batch_size", batch)
  per_epoch = data.get("num_train", SudokuData.num_train) / batch
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
  task = {"type": "trm_sudoku", "data": data, **{k: raw.pop(k) for k in ("model", "optim") if k in raw}}
  return {**raw, "task": task, "trainer": trainer}
