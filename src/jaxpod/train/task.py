"""`Task`: what the one trainer needs from a workload (model, loss, data, eval); tasks live in `jaxpod.tasks`.

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
    train_iter() / eval_iter       checkpointable train iterator (get_state/set_state) / eval batches; its
                                   `__next__` may raise `EndOfData` (every host, the same step) to end the run early
    evaluator(graphdef, mesh, ema_sh, buffer_sh, batch_sh)   callable (params, buffers) -> eval dict
    hooks(graphdef, mesh, tcfg)    task-specific hooks, run after eval (LM: SampleHook)
    initial_params(mesh, shardings)  optional: (params, buffers) to start from, placed in shardings.params /
                                   shardings.buffers (e.g. a HF checkpoint); absent or None: init_model(seed)
    rebuilt_buffers                optional: keys of `buffers` rebuilt from the starting weights on resume rather than
                                   checkpointed (DPO's frozen reference; `train.rebuilt`)
    eval_summary(ev)               (label, value) rows for the end-of-run table
    summary_fields(run_dir)        optional: extra keys for summary.json (leader, after the run; e.g. accuracy.start)
    name, headline                 run-folder prefix; the eval metric logged first (optional)
    updates_per_batch              optional: optimizer updates per batch, in one step (GRPO's num_iterations; 1)
    loss_normalizer                optional: the metric sum the loss is a mean over ("tokens"); None: the batch's
                                   rows (what gradient accumulation weights each microbatch by: train/step.py)

A task is two classes in one module of `jaxpod.tasks` (or any module imported before parsing):
its config, registered with `@TaskConfig.register_subclass("name")`, whose `build(cfg)` returns
the task object. `make_task(cfg)` calls it; the trainer never names a task.
"""
from __future__ import annotations

from typing import Any, Callable, Protocol

from jaxpod.train.config import TrainConfig


class EndOfData(Exception):
  """Raised by a train iterator's `__next__`, on every host for the same step, when nothing is left worth training on
  (RL: the policy solves the problems it draws). The run ends at the last trained step as it would at trainer.steps
  (final eval, checkpoint, export, summary with `end_reason`; exit 0). Its message says why, in one line."""

  coordinated = True  # every host raises it at the same step: not a failure to publish to the others


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




def make_task(cfg: TrainConfig) -> Task:
  """The task a config describes: `cfg.task.build(cfg)` (the config class was registered by its module)."""
  return cfg.task.build(cfg)
