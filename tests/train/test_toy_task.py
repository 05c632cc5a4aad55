"""A third task added in one module (tests/train/toy_task.py) trains through the real trainer."""
import json
from pathlib import Path

import numpy as np
import orbax.checkpoint as ocp

from jaxpod.runtime.hooks import Listener
from tests.train import toy_task  # noqa: F401 - importing it registers `toy_linear`


class Recorder(Listener):
  """A user's listener: sees every step's training metrics and every due hook's results."""

  def __init__(self):
    self.metrics, self.results = [], []

  def on_metrics(self, step, metrics):
    self.metrics.append((step, sorted(metrics)))

  def on_results(self, step, results):
    self.results.append((step, sorted(results)))


def test_a_task_in_one_module_trains_through_the_trainer(tmp_path):
  """`--task.type toy_linear` parses as any task does; the trainer learns W_TRUE, evaluates, checkpoints, plots;
  a listener hook gets every step's metrics and the eval results (which the summary finds by type)."""
  from jaxpod.cli.train import load_config
  from jaxpod.train import train
  cfg = load_config(["--task.type", "toy_linear", "--task.lr", "0.05", "--trainer.steps", "40",
                     "--trainer.eval_every", "20", "--trainer.log_every", "1", "--trainer.ema", "0",
                     "--trainer.runs_dir", str(tmp_path), "--trainer.progress", "false",
                     "--tracker.tensorboard", "false"])
  assert isinstance(cfg.task, toy_task.ToyLinearConfig)
  recorder = Recorder()
  summary = train(cfg, extra_hooks=[recorder])
  run = Path(summary.run_dir)
  assert recorder.metrics == [(s, ["grad_norm", "loss"]) for s in range(1, 41)]
  assert recorder.results == [(20, ["eval/count", "eval/mse"]), (40, ["eval/count", "eval/mse"])]
  assert run.name.startswith("toy-")
  recs = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
  losses = [r["loss"] for r in recs if "loss" in r]
  assert len(losses) == 40 and losses[-1] < 0.01 * losses[0], losses
  assert [r["step"] for r in recs if "eval/mse" in r] == [20, 40]
  assert summary.eval["mse"] < 0.01 and summary.eval["count"] == 64
  with ocp.CheckpointManager(run / "checkpoints") as mgr:
    assert mgr.all_steps() == [40]
    state = mgr.restore(40, args=ocp.args.Composite(state=ocp.args.StandardRestore()))["state"]
  np.testing.assert_allclose(np.asarray(state["params"]["w"]["value"]), toy_task.W_TRUE, atol=0.05)
  assert (run / "metrics.png").stat().st_size > 0
  assert json.loads((run / "config.json").read_text())["task"]["type"] == "toy_linear"


def test_an_iterator_that_ends_early_ends_the_run_at_its_last_step_and_a_rerun_trains_nothing(tmp_path):
  """`EndOfData` from the train iterator (every host, the same step; RL raises it when the policy solves its problems)
  ends the run at the last trained step as trainer.steps would: final eval and checkpoint there, summary.json with
  the reason, exit 0; rerunning the same command restores that step, finds the data still ended, trains nothing
  and returns the stored summary."""
  from jaxpod.cli.train import load_config
  from jaxpod.train import train
  cfg = load_config(["--task.type", "toy_linear", "--task.data.end_after", "25", "--trainer.steps", "40",
                     "--trainer.eval_every", "10", "--trainer.checkpoint_every", "10", "--trainer.log_every", "1",
                     "--trainer.ema", "0", "--trainer.runs_dir", str(tmp_path), "--trainer.progress", "false",
                     "--tracker.tensorboard", "false"])
  recorder = Recorder()
  summary = train(cfg, extra_hooks=[recorder])
  run = Path(summary.run_dir)
  assert summary.final_step == 25 and "task.data.end_after" in summary.end_reason
  assert [s for s, _ in recorder.metrics] == list(range(1, 26))
  assert [s for s, _ in recorder.results] == [10, 20, 25]  # the last step evaluated as a final one
  with ocp.CheckpointManager(run / "checkpoints") as mgr:
    assert max(mgr.all_steps()) == 25
  stored = json.loads((run / "summary.json").read_text())
  assert stored["final_step"] == 25 and stored["end_reason"] == summary.end_reason
  again = Recorder()
  rerun = train(cfg, extra_hooks=[again])
  assert again.metrics == [] and rerun.final_step == 25 and rerun.resumed
  with ocp.CheckpointManager(run / "checkpoints") as mgr:
    assert max(mgr.all_steps()) == 25
