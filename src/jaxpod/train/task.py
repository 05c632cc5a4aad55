"""`Task`: what the one trainer needs from a workload (model, loss, data, eval); TRM on Sudoku is one.

The trainer (`trainer.py`) owns everything generic: runtime, mesh, TrainState and its
shardings, optimizer step, EMA, checkpoints, hooks, tracker. A task supplies:

    prepare()                      leader only; its (JSON-able or numpy) result reaches every host
    setup(prepared, host, hosts)   build this host's data loader from it; check the model against it
    batch_ndims                    {batch key: ndim}; every key is split over the data-parallel axes
    abstract_model(seed)           (graphdef, params, buffers) as shapes, nothing allocated
    init_model(seed)               (params, buffers); traced inside the jitted state init
    init_carry(global_batch)       extra state carried from step to step (TRM: the ACT carry; LM: ())
    optimizer()                    (optax transformation, lr schedule or None)
    loss_fn(graphdef)              (params, buffers, batch, rng, carry) -> (loss, (carry, metric sums))
    normalize(raw, global_batch)   host-side metric sums -> logged values
    train_iter() / eval_iter       checkpointable train iterator (get_state/set_state) / eval batches
    evaluator(graphdef, mesh, ema_sh, buffer_sh, batch_sh)   callable (params, buffers) -> eval dict
    hooks(graphdef, mesh, tcfg)    task-specific hooks, run after eval (LM: SampleHook)
    eval_summary(ev)               (label, value) rows for the end-of-run table

`make_task(cfg)` picks the task from the config: `cfg.lm` set -> `LMTask`, else `SudokuTask`.
"""
from __future__ import annotations

from typing import Any, Callable, Protocol

from jaxpod.train.config import TrainConfig


class Task(Protocol):
  """The workload-specific half of a training run (see the module docstring)."""

  name: str
  batch_ndims: dict[str, int]

  def prepare(self) -> Any: ...

  def setup(self, prepared: Any, host_index: int, host_count: int) -> None: ...

  def abstract_model(self, seed: int): ...

  def init_model(self, seed: int): ...

  def init_carry(self, global_batch: int) -> Any: ...

  def optimizer(self): ...

  def loss_fn(self, graphdef) -> Callable: ...

  def normalize(self, raw: dict, global_batch: int) -> dict: ...

  def train_iter(self): ...

  def evaluator(self, graphdef, mesh, ema_sh, buffer_sh, batch_sh) -> Callable[[Any, Any], dict]: ...

  def hooks(self, graphdef, mesh, tcfg) -> list: ...

  def eval_summary(self, ev: dict) -> list[tuple[str, str]]: ...


class SudokuTask:
  """TRM on Sudoku: ACT carry across steps, AdamATan2 + SignSGD, exact-accuracy eval."""

  name = "trm"
  batch_ndims = {"inputs": 2, "labels": 2, "puzzle_identifiers": 1}

  def __init__(self, cfg: TrainConfig):
    self.cfg = cfg
    self.loader = None

  def prepare(self) -> str:
    from jaxpod.train import data as train_data
    return train_data.ensure_dataset(self.cfg.data, self.cfg.trainer.runs_dir)

  def setup(self, prepared: str, host_index: int, host_count: int) -> None:
    from jaxpod.train import data as train_data
    self.data_path = prepared
    self.loader = train_data.make_loader(self.cfg.data, prepared, host_index, host_count)
    meta, model = self.loader.metadata, self.cfg.model
    for field, key in (("seq_len", "seq_len"), ("vocab_size", "vocab_size")):
      if getattr(model, field) != meta[key]:
        raise ValueError(f"model.{field}={getattr(model, field)} but the dataset has {key}={meta[key]}; "
                         f"set model.{field}={meta[key]}")
    if model.num_puzzle_identifiers < meta["num_puzzle_identifiers"]:
      raise ValueError(f"model.num_puzzle_identifiers={model.num_puzzle_identifiers} < the dataset's "
                       f"{meta['num_puzzle_identifiers']}")

  def abstract_model(self, seed: int):
    from flax import nnx
    from jaxpod.models import trm
    return trm.split_model(nnx.eval_shape(lambda: trm.TRM(self.cfg.model, rngs=nnx.Rngs(seed))))

  def init_model(self, seed: int):
    from flax import nnx
    from jaxpod.models import trm
    _, params, buffers = trm.split_model(trm.TRM(self.cfg.model, rngs=nnx.Rngs(seed)))
    return params, buffers

  def init_carry(self, global_batch: int):
    from jaxpod.models import trm
    return trm.init_carry(self.cfg.model, global_batch)

  def optimizer(self):
    from jaxpod.models import trm
    o = self.cfg.optim
    return trm.make_optimizer(o), trm.warmup_schedule(o.lr, o.warmup_steps, o.total_steps, o.lr_min_ratio)

  def loss_fn(self, graphdef) -> Callable:
    from jaxpod.models import trm
    loss_type = self.cfg.model.loss_type

    def loss(params, buffers, batch, rng, carry):
      value, (carry, _, metrics) = trm.train_loss(graphdef, params, buffers, carry, batch, rng, loss_type)
      return value, (carry, metrics)

    return loss

  def normalize(self, raw: dict, global_batch: int) -> dict:
    from jaxpod.train.step import normalize
    return normalize(raw, global_batch)

  def train_iter(self):
    return self.loader.train_iter()

  def evaluator(self, graphdef, mesh, ema_sh, buffer_sh, batch_sh):
    from jaxpod.train.evaluate import Evaluator
    return Evaluator(graphdef, self.cfg.model, mesh, ema_sh, buffer_sh, batch_sh, self.loader.eval_iter)

  def hooks(self, graphdef, mesh, tcfg) -> list:
    return []

  def eval_summary(self, ev: dict) -> list[tuple[str, str]]:
    return [("eval exact accuracy", f"{ev.get('exact_accuracy', float('nan')):.4f} on {ev.get('count', 0)} "
                                    "held-out puzzles (EMA weights)"),
            ("eval cell accuracy", f"{ev.get('accuracy', float('nan')):.4f}")]


def make_task(cfg: TrainConfig) -> Task:
  """The task a config describes: `lm:` set -> causal LM on a text file, else TRM on Sudoku."""
  if cfg.lm is not None:
    from jaxpod.train.lm_task import LMTask
    return LMTask(cfg)
  return SudokuTask(cfg)
