"""The trainer in one process (8 CPU devices): it learns, resumes exactly, and hooks do not perturb it."""
import json
from pathlib import Path

import numpy as np
import orbax.checkpoint as ocp
import pytest

from jaxpod.train import Hook, train
from tests.conftest import SigTermAt
from tests.train.conftest import tiny_config


def _records(run_dir):
  return [json.loads(l) for l in Path(run_dir, "metrics.jsonl").read_text().splitlines()]


def _final_params(run_dir, step):
  """The checkpointed train state at `step` as numpy (every leaf)."""
  with ocp.CheckpointManager(Path(run_dir, "checkpoints")) as mgr:
    restored = mgr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
  return restored["state"]


def _assert_trees_equal(a, b):
  import jax
  la, lb = jax.tree_util.tree_flatten_with_path(a)[0], jax.tree_util.tree_flatten_with_path(b)[0]
  assert [p for p, _ in la] == [p for p, _ in lb]
  for (path, x), (_, y) in zip(la, lb):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=jax.tree_util.keystr(path))


@pytest.mark.slow
def test_tiny_config_learns(tmp_path, data_dir):
  """Loss drops and accuracy rises within a few dozen steps; run folder has metrics, a checkpoint and a plot."""
  cfg = tiny_config(tmp_path, data_dir, steps=60, trainer__run_name="learns", trainer__eval_every=60,
                    trainer__plot="true", tracker__tensorboard="true")
  summary = train(cfg)
  recs = [r for r in _records(summary.run_dir) if "loss" in r]
  first, last = np.mean([r["loss"] for r in recs[:5]]), np.mean([r["loss"] for r in recs[-5:]])
  assert last < 0.8 * first, (first, last)
  acc = [r["accuracy"] for r in recs if r.get("count", 0) > 0]
  assert np.mean(acc[-3:]) > np.mean(acc[:3]) + 0.1, acc
  assert summary.eval["count"] == 32 and summary.eval["accuracy"] > 0.4
  run = Path(summary.run_dir)
  assert (run / "metrics.png").stat().st_size > 0 and list((run / "tb").iterdir())
  with ocp.CheckpointManager(run / "checkpoints") as mgr:
    assert mgr.all_steps() == [60]  # finished by Orbax's commit protocol


class _Raise(Hook):
  def __init__(self, at):
    self.every, self.at = 1, at

  def __call__(self, info):
    if info.step == self.at:
      raise KeyboardInterrupt(f"interrupted at step {info.step}")


@pytest.mark.slow
def test_interrupted_and_resumed_equals_uninterrupted(tmp_path, data_dir):
  """Invariants 5 and 6: stop at step 5 (checkpoint at 3), rerun -> exactly the parameters of one
  uninterrupted run. The uninterrupted run evaluates every 2 steps, the other only at the end: the
  side job leaves the trajectory bit-identical."""
  common = dict(trainer__checkpoint_every=3, trainer__keep_last=3)
  straight = train(tiny_config(tmp_path, data_dir, steps=6, trainer__run_name="straight", trainer__eval_every=2,
                               **common))
  cfg = tiny_config(tmp_path, data_dir, steps=6, trainer__run_name="resumed", **common)
  with pytest.raises(KeyboardInterrupt):
    train(cfg, extra_hooks=[_Raise(5)])
  resumed = train(cfg)
  assert resumed.resumed and resumed.start_step == 3 and not straight.resumed
  _assert_trees_equal(_final_params(straight.run_dir, 6), _final_params(resumed.run_dir, 6))
  a = [(r["step"], r["loss"]) for r in _records(straight.run_dir) if "loss" in r]
  b = [(r["step"], r["loss"]) for r in _records(resumed.run_dir) if "loss" in r]
  assert a == b  # steps logged before the interruption and past the checkpoint are not duplicated


def test_rerunning_the_same_command_continues_the_same_run(tmp_path, data_dir):
  """Invariant 8 (rerun resumes): no run_name -> the run folder is named by the config, so the same command
  again finds it; more steps continue it; another recipe is another run."""
  first = train(tiny_config(tmp_path, data_dir, steps=3, trainer__checkpoint_every=3, trainer__run_name=None))
  longer = train(tiny_config(tmp_path, data_dir, steps=4, trainer__run_name=None))
  other = train(tiny_config(tmp_path, data_dir, steps=3, task__optim__lr=1e-3, trainer__run_name=None))
  assert longer.run_dir == first.run_dir and longer.resumed and longer.start_step == 3
  assert other.run_dir != first.run_dir and not other.resumed
  again = train(tiny_config(tmp_path, data_dir, steps=4, trainer__run_name=None))  # finished: nothing to do
  assert again.resumed and again.final_step == 4 and again.eval == longer.eval


def test_resume_never_refuses_a_run_with_checkpoints(tmp_path, data_dir):
  train(tiny_config(tmp_path, data_dir, steps=2, trainer__run_name="r"))
  with pytest.raises(ValueError, match="trainer.resume=never but .* already holds checkpoints"):
    train(tiny_config(tmp_path, data_dir, steps=2, trainer__run_name="r", trainer__resume="never"))


def test_sigterm_saves_at_the_next_step_boundary_and_a_rerun_resumes_exactly(tmp_path, data_dir):
  """Preemption: SIGTERM during step 2's hooks -> checkpoint at the next step boundary (3), exit code 143;
  the rerun loses no step and ends with the parameters of an uninterrupted run."""
  straight = train(tiny_config(tmp_path, data_dir, steps=5, trainer__run_name="straight"))
  cfg = tiny_config(tmp_path, data_dir, steps=5, trainer__run_name="preempted")
  with pytest.raises(SystemExit) as exit_info:
    train(cfg, extra_hooks=[SigTermAt(2)])
  assert exit_info.value.code == 143
  with ocp.CheckpointManager(Path(tmp_path, "preempted", "checkpoints")) as mgr:
    assert mgr.all_steps() == [3]
  resumed = train(cfg)
  assert resumed.resumed and resumed.start_step == 3
  _assert_trees_equal(_final_params(straight.run_dir, 5), _final_params(resumed.run_dir, 5))


@pytest.mark.slow
def test_ema_zero_keeps_no_copy_and_resumes_a_checkpoint_written_with_one(tmp_path, data_dir):
  """trainer.ema=0 keeps no EMA copy (state and checkpoint: the evaluated weights are the live ones); a checkpoint
  written with an EMA still resumes at ema=0 (its copy is skipped, never read); one without an EMA refuses a target
  that wants one in one line and stays where it is (a configuration change is not damage, invariant 5)."""
  import jax
  from jax.sharding import NamedSharding, PartitionSpec
  from jaxpod import runtime
  from jaxpod.io import CheckpointConfig, Checkpointer, CheckpointMismatch
  with_ema = train(tiny_config(tmp_path, data_dir, steps=2, trainer__run_name="r", trainer__ema=0.5))
  old = _final_params(with_ema.run_dir, 2)
  assert "ema_params" in old
  without = train(tiny_config(tmp_path, data_dir, steps=3, trainer__run_name="r", trainer__ema=0.0))
  assert without.resumed and without.start_step == 2
  state = _final_params(without.run_dir, 3)
  assert "ema_params" not in state and "params" in state and "opt_state" in state
  replicated = NamedSharding(runtime.make_mesh(), PartitionSpec())
  wants_ema = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated), old)
  ckpt = Checkpointer(CheckpointConfig(dir=str(Path(without.run_dir, "checkpoints"))))
  with pytest.raises(CheckpointMismatch, match="has no ema_params.*trainer.ema=0") as err:
    ckpt.restore(wants_ema)
  ckpt.close()
  assert "\n" not in str(err.value)
  assert sorted(p.name for p in Path(without.run_dir, "checkpoints").iterdir() if p.name.isdigit()) == ["2", "3"]
  assert not Path(without.run_dir, "checkpoints.invalid").exists()
