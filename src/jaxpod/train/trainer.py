"""The training loop: validate, init runtime and mesh, build or resume the state, step, run hooks, summarise.

    from jaxpod.train import TrainConfig, train
    summary = train(TrainConfig())       # what `jaxpod train` runs

Order of work (each line is the same on every host):
1. validate the config against the hosts and the storage before JAX initialises (invariants 7, 8);
2. `runtime.init`; the leader decides the run folder (`<runs_dir>/<run_name or task-confighash>`: the
   same command gives the same folder, so a rerun resumes) and prepares the task's data
   (`Task.prepare`: Sudoku dataset folder, LM token file, both in shared storage); others receive
   their URLs;
3. mesh, optimizer, abstract state and its shardings; restore the agreed checkpoint (invariant 5;
   `trainer.resume`) or init straight into the shardings;
4. loop: next global batch, dispatch step N, read step N-1's metrics (waiting in slices that
   look for failed peers, so a dead host is named instead of hanging), run due hooks; a
   preemption notice (SIGTERM on any host) saves the same step everywhere and exits 143;
5. final hooks (eval, checkpoint), plot, summary.
Every file goes through `runtime.storage`: the runs folder may be local (one host) or gs://.
"""
from __future__ import annotations

import dataclasses
import json
import time
from typing import Any, Callable, Sequence

from jaxpod import runtime
from jaxpod.runtime import storage
from jaxpod.runtime.log import get_logger
from jaxpod.runtime.progress import mark as mark_progress  # the watchdog's marks (train.progress: the bar)
from jaxpod.train.config import TrainConfig, legacy_run_id, run_id, validate_for_hosts, validate_storage
from jaxpod.train.hooks import (CheckpointHook, EvalHook, Hook, ProgressHook, StepInfo, TrackerHook, find_hook,
                                run_hooks)
from jaxpod.train.preemption import Preempted, PreemptionWatch
from jaxpod.train.rebuilt import RebuiltBuffers
from jaxpod.train.task import EndOfData

log = get_logger("train")
POLL_S = 0.02  # longest sleep between readiness polls
PEER_CHECK_S = 1.0  # look for failed peers this often while waiting on the device


@dataclasses.dataclass
class RunSummary:
  """What a finished run reports (also written to <run_dir>/summary.json by the leader)."""

  run_dir: str
  start_step: int
  final_step: int
  final_metrics: dict
  eval: dict
  time_to_first_step_s: float
  wall_s: float
  steps_per_s: float
  compile_cache_hits: int
  compile_cache_misses: int
  resumed: bool
  end_reason: str = ""  # why the run ended before trainer.steps (the iterator's `EndOfData`); "" if it did not
  trained_params: int = 0  # parameters the optimizer updates (with LoRA: the adapters alone)
  frozen_params: int = 0  # weights in the state it does not update (LoRA's base, a frozen reference)


def run_url(cfg: TrainConfig, prefix: str) -> str:
  """The run folder: `<runs_dir>/<run_name>`, or `<runs_dir>/<prefix>-<config hash>` (a rerun finds it again, also
  one named by the hash rule before upgrades kept ids)."""
  from jaxpod.train.run_ids import find_run
  runs = storage.absolute(cfg.trainer.runs_dir)
  if cfg.trainer.run_name:
    url = storage.join(runs, cfg.trainer.run_name)
  else:
    url = find_run(runs, run_id(cfg, prefix), legacy_run_id(cfg, prefix))
  storage.makedirs(url)
  return url


def wait_ready(arrays, where: str) -> None:
  """Block until `arrays` are computed, checking for failed peers about once a second (never a silent hang)."""
  import jax
  leaves = jax.tree.leaves(arrays)
  sleep, waited, next_check = 1e-4, 0.0, 0.0
  while not all(x.is_ready() for x in leaves):
    if waited >= next_check:
      runtime.check_peers(where)
      next_check = waited + PEER_CHECK_S
    time.sleep(sleep)
    waited += sleep
    sleep = min(sleep * 2, POLL_S)


def _to_dict(cfg: TrainConfig) -> dict:
  from jaxpod.train.config import task_type
  out = json.loads(json.dumps(dataclasses.asdict(cfg), default=str))
  out["task"] = {"type": task_type(cfg.task), **out["task"]}  # the registry name, as in YAML
  return out


@dataclasses.dataclass
class Loop:
  """What the step loop needs, gathered once by `_run`."""

  task: Any  # the Task (normalises the metrics)
  step_fn: Callable  # jitted (state, batch) -> (state, metric sums)
  iterator: Any  # the task's checkpointable train iterator
  batch_sh: dict  # {batch key: NamedSharding}
  hooks: list  # due hooks (eval, sampling, checkpoint, ...) and listeners (progress, tracker), in call order
  run_dir: str
  mesh: Any
  preemption: PreemptionWatch
  steps: int  # the last step (trainer.steps)
  global_batch: int  # rows per step over all hosts


def train(cfg: TrainConfig, extra_hooks: Sequence[Hook] = (), task=None) -> RunSummary:
  """Run training as configured; every host calls this. Returns the run summary. `task`: the Task, when the caller
  builds it with what is no config (RL's batch source); None: `cfg.task.build(cfg)`."""
  hosts = cfg.runtime.hosts()
  validate_for_hosts(cfg, hosts)  # invariant 7: before JAX initialises
  validate_storage(cfg, hosts)  # invariant 8: shared storage with several hosts
  t_start = time.monotonic()
  runtime.init(cfg.runtime, runs_dir=cfg.trainer.runs_dir)
  import jax
  validate_for_hosts(cfg, hosts, jax.device_count())
  from jaxpod.train.task import make_task
  with runtime.guard():
    task = make_task(cfg) if task is None else task
    run_dir = runtime.broadcast_call(lambda: run_url(cfg, task.name), "train.run_dir")
    mark_progress("train: preparing the data")
    prepared = runtime.broadcast_call(task.prepare, "train.dataset", timeout_s=3600)
    return _run(cfg, task, run_dir, prepared, extra_hooks, t_start)


def _run(cfg: TrainConfig, task, run_dir: str, prepared, extra_hooks, t_start: float) -> RunSummary:
  import jax
  from jaxpod.io import CheckpointConfig, Checkpointer
  from jaxpod.runtime import compile_cache
  from jaxpod.train import state as st
  from jaxpod.train import step as sp
  from jaxpod.train.progress import ProgressDisplay, print_summary
  from jaxpod.train.tracker import Tracker

  host = runtime.host_info()
  tcfg, dcfg = cfg.trainer, cfg.task.data
  mark_progress("train: setting up the task, the mesh and the state")
  task.setup(prepared, host.process_index, host.process_count)
  mesh = runtime.mesh_from_config(cfg.mesh)
  log.info("run %s: task %s, mesh %s", run_dir, task.name, runtime.describe_mesh(mesh))
  tracker = Tracker(cfg.tracker, run_dir, host.is_leader, _to_dict(cfg))
  if host.is_leader:
    storage.write_text(storage.join(run_dir, "config.json"), json.dumps(_to_dict(cfg), indent=1))

  tx, lr_fn = task.optimizer()
  graphdef, _, _ = st.abstract_model(task, tcfg.seed)
  init_fn = st.make_init_fn(task, tx, tcfg.seed, dcfg.global_batch_size, ema=tcfg.ema > 0)
  abstract = st.abstract_state(init_fn)
  sizes = {k: sum(x.size for x in jax.tree.leaves(getattr(abstract, k))) for k in ("params", "buffers")}
  log.info("parameters: %s trained, %s frozen", f"{sizes['params']:,}", f"{sizes['buffers']:,}")
  shardings = st.train_state_shardings(abstract, mesh)
  batch_sh = sp.batch_shardings(mesh, task.batch_ndims)

  ckpt = Checkpointer(CheckpointConfig(dir=storage.join(run_dir, "checkpoints"), keep_last=tcfg.keep_last,
                                       async_save=tcfg.async_checkpoints))
  iterator = task.train_iter()
  mark_progress("train: restoring the newest checkpoint")
  rebuilt = RebuiltBuffers(task, init_fn, mesh, shardings)  # e.g. DPO's reference: not in the checkpoints
  restored = _restore(tcfg, ckpt, rebuilt.target(st.to_nested(st.with_shardings(abstract, shardings))),
                      rebuilt.optional())
  if restored is not None:
    start, tree, data_state = restored
    state = st.from_nested(rebuilt.complete(tree), abstract)
    if data_state is not None:
      iterator.set_state(data_state)
    tracker.truncate_after(start)
    log.info("resumed from checkpoint step %d", start)
  else:
    start = 0
    initial = getattr(task, "initial_params", None)
    state = st.init_state(init_fn, shardings, initial(mesh, shardings) if initial is not None else None)
  rebuilt.remember(state)
  if start >= tcfg.steps:
    log.warning("run %s is already complete at step %d: nothing to train (raise --trainer.steps to train further, "
                "or pass --trainer.run_name NEW for a new run)", run_dir, start)
    tracker.close()
    ckpt.close()
    stored = _stored_summary(run_dir, task, host)
    if stored is not None:
      return stored

  with jax.set_mesh(mesh):
    step_fn = sp.jit_train_step(sp.train_step_fn(task.loss_fn(graphdef), tx, tcfg.ema, lr_fn,
                                                 getattr(task, "updates_per_batch", 1), tcfg.microbatches,
                                                 getattr(task, "loss_normalizer", None)), shardings, batch_sh, mesh)
    evaluator = task.evaluator(graphdef, mesh, shardings.eval_params, shardings.buffers, batch_sh)
    progress = ProgressDisplay(tcfg.steps, start, host.is_leader and tcfg.progress, start_time=t_start,
                               metrics=cfg.task.bar_metrics)
    hooks: list[Hook] = [EvalHook(evaluator, tcfg.eval_every, getattr(task, "headline", None),
                                  at_start=tcfg.eval_at_start),
                         *task.hooks(graphdef, mesh, tcfg), *extra_hooks,
                         CheckpointHook(ckpt, tcfg.checkpoint_every, rebuilt.checkpoint_tree,
                                        before_save=tracker.sync),
                         ProgressHook(progress), TrackerHook(tracker, tcfg.log_every, tcfg.steps)]
    loop = Loop(task, step_fn, iterator, batch_sh, hooks, run_dir, mesh,
                PreemptionWatch(host.multi_process, tcfg.preemption_check_every), tcfg.steps, dcfg.global_batch_size)
    try:
      last, final_step, ended = _loop(loop, state, start)
    except Preempted as e:
      progress.close()
      tracker.close()
      log.warning("preempted: checkpoint of step %d saved in %s; rerun the same command to resume", e.step,
                  run_dir)
      raise
    except BaseException as e:
      progress.close()
      _on_failure(e, host, ckpt)
      raise
    finally:
      loop.preemption.close()
  for hook in hooks:
    hook.close()
  if ended:
    log.warning("run %s ended at step %d of %d: %s", run_dir, final_step, tcfg.steps, ended)
    if final_step == start and start > 0:  # a rerun of a run that had ended there: nothing new to report
      stored = _stored_summary(run_dir, task, host)
      if stored is not None:
        return stored
  wall = time.monotonic() - t_start
  steps_done = final_step - start
  loop_s = max(wall - (progress.first_step_s or 0.0), 1e-9)
  eval_hist = find_hook(hooks, EvalHook).history
  summary = RunSummary(run_dir=run_dir, start_step=start, final_step=final_step, final_metrics=last,
                       eval=eval_hist[-1][1] if eval_hist else {},
                       time_to_first_step_s=progress.first_step_s or 0.0, wall_s=wall,
                       steps_per_s=max(steps_done - 1, 0) / loop_s, compile_cache_hits=compile_cache.STATS.hits,
                       compile_cache_misses=compile_cache.STATS.misses, resumed=restored is not None,
                       end_reason=ended, trained_params=sizes["params"], frozen_params=sizes["buffers"])
  if host.is_leader:
    _finish(cfg, task, summary, progress.console, print_summary)
  runtime.barrier("train.end", timeout_s=600)
  return summary


def _stored_summary(run_dir: str, task, host) -> RunSummary | None:
  """The summary.json a finished run wrote (printed again on the leader), or None if there is none."""
  from jaxpod.train.progress import ProgressDisplay, print_summary
  done = storage.join(run_dir, "summary.json")
  if not storage.exists(done):
    return None
  fields = {f.name for f in dataclasses.fields(RunSummary)}  # summary.json may hold the task's own keys too
  summary = RunSummary(**{**{k: v for k, v in json.loads(storage.read_text(done)).items() if k in fields},
                          "resumed": True})
  if host.is_leader:
    print_summary(ProgressDisplay(0, 0, False).console, _summary_rows(task, summary))
  return summary


def _on_failure(e: BaseException, host, ckpt) -> None:
  """Name the root cause, then (one process only) commit finished checkpoints before going down."""
  if isinstance(e, runtime.PeerFailed):
    return
  if isinstance(e, Exception) and not getattr(e, "coordinated", False):  # coordinated: every host raises it
    runtime.check_peers("train loop")  # a failed peer explains a broken collective better than its error
  if not host.multi_process:
    ckpt.wait()  # with several hosts the peers may be gone: nothing collective on the way down


def _restore(tcfg, ckpt, target, optional: tuple[str, ...] = ()):
  """`trainer.resume`: this run's newest good checkpoint (auto), none (never: refuse if there is one), or,
  when this run has none yet, the newest good one under a given URL (a run folder or its checkpoints/);
  `optional`: checkpoint paths a step may lack (`Checkpointer.restore`)."""
  from jaxpod.io import CheckpointConfig, Checkpointer
  if tcfg.resume == "never":
    found = ckpt.steps()
    if found:
      raise ValueError(f"trainer.resume=never but {ckpt.dir} already holds checkpoints (steps {found}); pass "
                       "--trainer.run_name NEW for a new run, or --trainer.resume auto to continue")
    return None
  restored = ckpt.restore(target, optional)
  if restored is not None or tcfg.resume == "auto":
    return restored
  source = tcfg.resume
  if storage.exists(storage.join(source, "checkpoints")):
    source = storage.join(source, "checkpoints")
  other = Checkpointer(CheckpointConfig(dir=source))
  restored = other.restore(target, optional)
  other.close()
  if restored is None:
    raise ValueError(f"trainer.resume={tcfg.resume}: no checkpoint there restores on every host")
  log.info("starting from %s step %d", source, restored[0])
  return restored


def _loop(loop: Loop, state, start: int) -> tuple[dict, int, str]:
  """Steps start+1..steps, or until the iterator raises `EndOfData`; returns the last host-side normalised training
  metrics (with the last hook results), the last step trained and why the run ended early ("" if it did not)."""
  from jaxpod.train import step as sp
  pending = None  # (step number, device metrics) of the step whose metrics are still on the device
  latest = _start_hooks(loop, state, start)

  def drain(pending) -> dict:
    step, metrics = pending
    wait_ready(metrics, f"train step {step}")
    values = loop.task.normalize(sp.host_metrics(metrics), loop.global_batch)
    for hook in loop.hooks:
      hook.on_metrics(step, values)
    return values

  step, ended = start, ""
  for step in range(start + 1, loop.steps + 1):
    mark_progress(f"train step {step}", step=True)  # the watchdog's step time: step to step, hooks included
    try:
      host_batch = next(loop.iterator)
    except EndOfData as e:
      step, ended = step - 1, str(e) or "the train iterator ended"
      break
    batch = sp.global_batch(host_batch, loop.batch_sh)
    state, metrics = loop.step_fn(state, batch)
    if pending is not None:
      latest = drain(pending)
    pending = (step, metrics)
    final = step == loop.steps
    preempted = loop.preemption.reached(step)
    due = [h for h in loop.hooks if h.due(step, final)]
    if due or preempted:
      latest = drain(pending)
      pending = None
      latest, info = _run_due(loop, due, state, step, final, latest)
      if preempted:
        checkpoint = find_hook(loop.hooks, CheckpointHook)
        checkpoint(info)
        checkpoint.checkpointer.wait()
        raise Preempted(step)
  if pending is not None:
    latest = drain(pending)
  if ended and (step > start or start == 0):  # the last step becomes the final one: what its own round did not run
    due = [h for h in loop.hooks if h.due(step, True) and not h.due(step, False)]
    latest, _ = _run_due(loop, due, state, step, True, latest)
  return latest, step, ended


def _run_due(loop: Loop, due: list, state, step: int, final: bool, latest: dict) -> tuple[dict, StepInfo]:
  """Run the due hooks at `step`; their results go to every hook's on_results and into `latest`."""
  info = StepInfo(step=step, state=state, final=final, run_dir=loop.run_dir, mesh=loop.mesh, metrics=latest,
                  extras={"data_state": loop.iterator.get_state})
  out = run_hooks(due, info)
  if out:
    for hook in loop.hooks:
      hook.on_results(step, out)
    latest = {**latest, **out}
  return latest, info


def _start_hooks(loop: Loop, state, start: int) -> dict:
  """Every hook's `on_start` with the state the loop starts from; what they return is logged at `start`."""
  info = StepInfo(step=start, state=state, final=False, run_dir=loop.run_dir, mesh=loop.mesh, metrics={},
                  extras={"data_state": loop.iterator.get_state})
  out: dict = {}
  for hook in loop.hooks:
    mark_progress(f"{type(hook).__name__} before step {start + 1}")
    out.update(hook.on_start(info) or {})
  if out:
    for hook in loop.hooks:
      hook.on_results(start, out)
  return out


def _finish(cfg: TrainConfig, task, summary: RunSummary, console, print_summary) -> None:
  run_dir = summary.run_dir
  task_fields = getattr(task, "summary_fields", None)  # optional: keys the task adds (read from metrics.jsonl)
  extra = task_fields(run_dir) if task_fields is not None else {}
  storage.write_text(storage.join(run_dir, "summary.json"), json.dumps({**dataclasses.asdict(summary), **extra},
                                                                       indent=1, default=str))
  if cfg.trainer.plot:
    from jaxpod.train.plot import plot_run
    plot_run(run_dir)
  print_summary(console, _summary_rows(task, summary))


def _summary_rows(task, summary: RunSummary) -> list[tuple[str, str]]:
  ev = summary.eval
  return [("run folder", str(summary.run_dir)),
          ("steps", f"{summary.start_step} -> {summary.final_step}" + (" (resumed)" if summary.resumed else "")
           + (f" (ended early: {summary.end_reason})" if summary.end_reason else "")),
          ("train loss", f"{summary.final_metrics.get('loss', float('nan')):.4f}"),
          ("parameters", f"{summary.trained_params:,} trained, {summary.frozen_params:,} frozen"),
          *task.eval_summary(ev),
          ("time to first step", f"{summary.time_to_first_step_s:.1f} s (init, data, compile)"),
          ("steps/s", f"{summary.steps_per_s:.2f}"),
          ("wall time", f"{summary.wall_s:.1f} s"),
          ("compile cache", f"{summary.compile_cache_hits} hits, {summary.compile_cache_misses} misses")]
