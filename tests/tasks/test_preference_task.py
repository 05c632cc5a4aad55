"""The preference task on the one trainer: the DPO reference stays frozen, both reference modes agree, and the
built-in default reports held-out exact match at its start and end."""
from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from jaxpod.runtime import storage
from jaxpod.runtime.hooks import Hook
from tests.conftest import SigTermAt
from tests.tasks.conftest import pref_args

pytest.importorskip("datasets")


class KeepState(Hook):
  """Keeps the state the loop starts from and the final one (host copies)."""

  def __init__(self):
    self.start = self.end = None
    self.shardings = None

  def on_start(self, info):
    self.start = jax.tree.map(np.asarray, {"params": info.state.params, "buffers": info.state.buffers})

  def due(self, step, final):
    return final

  def __call__(self, info):
    s = info.state
    self.end = jax.tree.map(np.asarray, {"params": s.params, "buffers": s.buffers})
    self.shardings = {"params": jax.tree.map(lambda x: x.sharding.spec, s.params),
                      "ref": jax.tree.map(lambda x: x.sharding.spec, s.buffers.get("ref", {})),
                      "opt_leaves": len(jax.tree.leaves(s.opt_state)), "param_leaves": len(jax.tree.leaves(s.params))}


def _train(runs, ckpt, pairs, name, hooks=(), **overrides):
  from jaxpod.cli.train import load_config
  from jaxpod.train import train
  return train(load_config(pref_args(runs, ckpt, pairs, trainer__run_name=name, **overrides)), extra_hooks=hooks)


def _metrics(run_dir) -> list[dict]:
  lines = storage.read_text(storage.join(run_dir, "metrics.jsonl")).splitlines()
  return [r for r in map(json.loads, lines) if "loss" in r]


@pytest.fixture(scope="module")
def dpo_run(tmp_path_factory, tiny_ckpt, pair_file):
  """DPO from the tiny checkpoint with the reference in the step (start and final state kept)."""
  runs = tmp_path_factory.mktemp("pref_runs")
  keep = KeepState()
  summary = _train(runs, tiny_ckpt, pair_file, "in_step", [keep], task__loss__kind="dpo", task__loss__beta=0.5)
  return keep, summary


def test_the_dpo_reference_stays_frozen_and_is_never_optimised(dpo_run):
  keep, _ = dpo_run
  changed = jax.tree.leaves(jax.tree.map(lambda a, b: not np.array_equal(a, b), keep.start["params"],
                                         keep.end["params"]))
  assert all(changed), "every policy tensor trains"
  same = jax.tree.map(np.array_equal, keep.start["params"], keep.end["buffers"]["ref"])
  assert all(jax.tree.leaves(same)), "the reference is bit-identical to the starting weights after training"
  # AdamW keeps mu and nu per trained tensor (+ counters): a reference inside the optimizer would add leaves
  assert keep.shardings["opt_leaves"] <= 2 * keep.shardings["param_leaves"] + 4


def test_the_dpo_reference_is_sharded_like_the_policy_over_fsdp(tmp_path):
  """The trainer's state shardings on a 4-way FSDP mesh (abstract: no devices needed) give every reference
  tensor the PartitionSpec of the policy tensor it copies, and none of them is replicated."""
  from jax.sharding import AbstractMesh
  from jaxpod.cli.train import load_config
  from jaxpod.train import state as st
  from jaxpod.train.task import make_task
  task = make_task(load_config(["--task.type", "preference", "--task.loss.kind", "dpo",
                                "--trainer.runs_dir", str(tmp_path)]))
  abstract = st.abstract_state(st.make_init_fn(task, task.optimizer()[0], 0, 64))
  sh = st.train_state_shardings(abstract, AbstractMesh((1, 4, 1), ("data", "fsdp", "model")))
  policy = [s.spec for s in jax.tree.leaves(sh.params)]
  reference = [s.spec for s in jax.tree.leaves(sh.buffers["ref"])]
  assert reference == policy
  assert sum("fsdp" in spec for spec in reference) >= len(reference) // 2  # the matrices are split over fsdp


def test_precomputed_reference_log_probs_give_the_in_step_loss_and_gradient(dpo_run, tiny_ckpt, pair_file, tmp_path):
  """The same batch, the policy moved away from the reference: loss and gradient agree between the two modes."""
  from jaxpod import runtime
  from jaxpod.cli.train import load_config
  from jaxpod.data.preference_files import read_pair_file
  from jaxpod.tasks.preference_start import reference_logps
  from jaxpod.train.task import make_task
  keep, _ = dpo_run
  tasks = {mode: make_task(load_config(pref_args(tmp_path, tiny_ckpt, pair_file, task__loss__kind="dpo",
                                                 task__loss__beta=0.5, task__reference=mode)))
           for mode in ("in_step", "precomputed")}
  arrays, _ = read_pair_file(pair_file, tasks["in_step"].tokenizer, 12, 20, 0.05)
  batch = {k: v[:8].astype(np.int32) for k, v in arrays.items()}
  mesh = runtime.mesh_from_config(load_config(pref_args(tmp_path, tiny_ckpt, pair_file)).mesh)
  graphdef, start = tasks["in_step"].load_params(tiny_ckpt, mesh)
  trained = jax.tree.map(jax.numpy.asarray, keep.end["params"])
  ref = reference_logps(graphdef, start, batch, mesh, 8)
  results = {}
  for mode, buffers, extra in (("in_step", {"ref": start}, {}), ("precomputed", {}, {"ref": ref})):
    loss = tasks[mode].loss_fn(graphdef)
    fn = jax.jit(jax.value_and_grad(lambda p, bufs, b: loss(p, bufs, b, None, ())[0]))
    results[mode] = fn(trained, buffers, {**batch, **extra})
  (a, ga), (b, gb) = results["in_step"], results["precomputed"]
  assert float(a) == pytest.approx(float(b), rel=1e-5) and float(a) != pytest.approx(np.log(2.0), abs=1e-3)
  for x, y in zip(jax.tree.leaves(ga), jax.tree.leaves(gb)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-6)


def test_trl_metric_names_are_logged(dpo_run):
  _, in_step = dpo_run
  record = _metrics(in_step.run_dir)[-1]
  for name in ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies", "logps/chosen",
               "logps/rejected"):
    assert np.isfinite(record[name]), name


def _default_args(runs) -> list[str]:
  """A shrunken built-in default: a few warm-up steps, 64 prompts, a 1-layer model."""
  return ["--task.type", "preference", "--trainer.runs_dir", str(runs), "--trainer.steps", "3",
          "--trainer.eval_every", "0", "--trainer.checkpoint_every", "0", "--trainer.progress", "false",
          "--tracker.tensorboard", "false", "--task.sort.warmup_steps", "3", "--task.sort.warmup_batch", "16",
          "--task.sort.prompts", "64", "--task.sort.eval_size", "32", "--task.data.global_batch_size", "16",
          "--task.data.eval_pairs", "16", "--task.optim.warmup_steps", "1", "--task.model.num_hidden_layers", "1",
          "--task.model.hidden_size", "32", "--task.model.intermediate_size", "64"]


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
  """The shrunken default, its warm-up preempted at step 1, then the whole default run with the same config (which
  resumes the warm-up): (sort folder, warm-up config, summary of the finished preference run)."""
  from jaxpod.cli.train import load_config
  from jaxpod.tasks.preference_start import warmup_config
  from jaxpod.train import train
  from jaxpod.train.task import make_task
  cfg = load_config(_default_args(tmp_path_factory.mktemp("pref_default") / "runs"))
  task = make_task(cfg)
  folder = task.sort_folder(task.prepare())
  warm = warmup_config(cfg, folder)
  with pytest.raises(SystemExit) as exit_info:
    train(warm, extra_hooks=[SigTermAt(1)])
  assert exit_info.value.code == 143
  return folder, warm, train(cfg)


def test_the_builtin_default_reports_held_out_exact_match_at_start_and_end(default_run):
  """The shrunken default: warm-up, on-policy pairs, training, summary keys, plot."""
  _, _, summary = default_run
  saved = json.loads(storage.read_text(storage.join(summary.run_dir, "summary.json")))
  assert 0.0 <= saved["accuracy.start"] <= 1.0 and 0.0 <= saved["accuracy.end"] <= 1.0
  assert saved["pairs"]["extra_repeat"] == 64 and saved["pairs"]["on_policy"] + saved["pairs"]["teacher"] > 0
  assert storage.exists(storage.join(summary.run_dir, "metrics.png"))


def test_the_defaults_warm_up_is_rls_warmup_task_and_a_preempted_one_resumes(default_run):
  """The default warms up with `jaxpod rl`'s WarmupTask (the trainer, in the data cache, invariant 8): preempted
  at step 1, it holds a checkpoint of step 2, and the preference run resumes it there rather than starting over."""
  from jaxpod.policy.warmup import WarmupTaskConfig
  folder, warm, _ = default_run
  assert isinstance(warm.task, WarmupTaskConfig) and warm.task.problems.problem_set.teacher_dedup == 0.7
  assert warm.task.warmup.steps == 3 and warm.task.warmup.grad_clip == 0.0
  saved = json.loads(storage.read_text(storage.join(folder, "warmup", "summary.json")))
  assert saved["resumed"] and saved["start_step"] == 2 and saved["final_step"] == 3
  assert storage.exists(storage.join(folder, "warmup", "hf", "config.json"))


def test_a_local_checkpoint_with_several_hosts_is_refused_before_jax_starts(bucket, tiny_ckpt, pair_file):
  """Invariant 8: every host reads task.hf, so with 2 hosts it must be a bucket URL; one line names the field."""
  from jaxpod.cli.train import load_config
  from jaxpod.runtime import HostInfo
  from jaxpod.runtime.storage import StorageError
  from jaxpod.train.config import validate_storage
  cfg = load_config(pref_args(storage.join(bucket, "runs"), tiny_ckpt, pair_file))
  with pytest.raises(StorageError, match="task.hf=.* is a local path, but this job has 2 hosts"):
    validate_storage(cfg, HostInfo(process_index=0, process_count=2))
