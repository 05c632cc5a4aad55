"""The preference task on the one trainer: the DPO reference stays frozen, both reference modes agree, and the
built-in default reports held-out exact match at its start and end."""
from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from jaxpod.runtime import storage
from jaxpod.runtime.hooks import Hook
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
def dpo_runs(tmp_path_factory, tiny_ckpt, pair_file):
  """DPO from the tiny checkpoint with the reference in the step, and with it precomputed."""
  runs = tmp_path_factory.mktemp("pref_runs")
  keep = KeepState()
  in_step = _train(runs, tiny_ckpt, pair_file, "in_step", [keep], task__loss__kind="dpo", task__loss__beta=0.5)
  pre = _train(runs, tiny_ckpt, pair_file, "pre", task__loss__kind="dpo", task__loss__beta=0.5,
               task__reference="precomputed")
  return keep, in_step, pre


def test_the_dpo_reference_is_frozen_sharded_like_the_policy_and_never_optimised(dpo_runs, tiny_ckpt):
  keep, _, _ = dpo_runs
  changed = jax.tree.leaves(jax.tree.map(lambda a, b: not np.array_equal(a, b), keep.start["params"],
                                         keep.end["params"]))
  assert all(changed), "every policy tensor trains"
  same = jax.tree.map(np.array_equal, keep.start["params"], keep.end["buffers"]["ref"])
  assert all(jax.tree.leaves(same)), "the reference is bit-identical to the starting weights after training"
  assert keep.shardings["ref"] == keep.shardings["params"]  # same logical axes -> same mesh placement
  # AdamW keeps mu and nu per trained tensor (+ counters): a reference inside the optimizer would add leaves
  assert keep.shardings["opt_leaves"] <= 2 * keep.shardings["param_leaves"] + 4


def test_precomputed_reference_log_probs_train_exactly_like_the_in_step_reference(dpo_runs):
  _, in_step, pre = dpo_runs
  a, b = _metrics(in_step.run_dir), _metrics(pre.run_dir)
  assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2, 3, 4]
  for x, y in zip(a, b):
    for name in ("loss", "rewards/chosen", "rewards/margins", "logps/rejected"):
      assert x[name] == pytest.approx(y[name], rel=1e-5, abs=1e-5), (x["step"], name)
  assert a[0]["rewards/chosen"] == pytest.approx(0.0, abs=1e-5)  # step 1: the policy is the reference


def test_trl_metric_names_are_logged(dpo_runs):
  _, in_step, _ = dpo_runs
  record = _metrics(in_step.run_dir)[-1]
  for name in ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies", "logps/chosen",
               "logps/rejected"):
    assert np.isfinite(record[name]), name


def test_the_builtin_default_reports_held_out_exact_match_at_start_and_end(tmp_path):
  """A shrunken default (a few warm-up steps, 64 prompts): warm-up, on-policy pairs, training, summary keys, plot."""
  from jaxpod.cli.train import load_config
  from jaxpod.train import train
  args = ["--task.type", "preference", "--trainer.runs_dir", str(tmp_path / "runs"), "--trainer.steps", "3",
          "--trainer.eval_every", "0", "--trainer.checkpoint_every", "0", "--trainer.progress", "false",
          "--tracker.tensorboard", "false", "--task.sort.warmup_steps", "3", "--task.sort.warmup_batch", "16",
          "--task.sort.prompts", "64", "--task.sort.eval_size", "32", "--task.data.global_batch_size", "16",
          "--task.data.eval_pairs", "16", "--task.optim.warmup_steps", "1", "--task.model.num_hidden_layers", "1",
          "--task.model.hidden_size", "32", "--task.model.intermediate_size", "64"]
  summary = train(load_config(args))
  saved = json.loads(storage.read_text(storage.join(summary.run_dir, "summary.json")))
  assert 0.0 <= saved["accuracy.start"] <= 1.0 and 0.0 <= saved["accuracy.end"] <= 1.0
  assert saved["pairs"]["extra_repeat"] == 64 and saved["pairs"]["on_policy"] + saved["pairs"]["teacher"] > 0
  assert storage.exists(storage.join(summary.run_dir, "metrics.png"))
