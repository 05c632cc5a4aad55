"""RL test fixtures: one tiny colocated `jaxpod rl` run per session, through `run()` (warm-up, GRPO, export), and
one of the calculator's episodes, through the CLI.

Their warm-up exports are the starting policies of the multi-host tests (`warm_policy`, `calculator_policy`), so
the session pays for each warm-up once."""
from __future__ import annotations

import pytest

from tests.rl.clusters import CALCULATOR, TINY


@pytest.fixture(scope="session")
def colocated_run(tmp_path_factory):
  """(config, summary, run folder) of a finished 3-step colocated run with a 200-step warm-up, sampling with
  top-k and top-p filters (what the trainer must recompute log-probs under)."""
  import draccus
  from jaxpod.rl.config import RLConfig
  from jaxpod.rl.run import run, run_dir
  runs = tmp_path_factory.mktemp("rl_colocated")
  cfg = draccus.parse(RLConfig, args=[*TINY, "--warmup.steps", "200", "--warmup.batch_size", "32", "--warmup.lr",
                                      "3e-3", "--trainer.steps", "3", "--trainer.eval_every", "3",
                                      "--trainer.checkpoint_every", "2", "--trainer.runs_dir", str(runs),
                                      "--rollout.top_k", "20", "--rollout.top_p", "0.9"])
  return cfg, run(cfg), run_dir(cfg)


@pytest.fixture(scope="session")
def warm_policy(colocated_run) -> str:
  """The HF checkpoint the session's colocated run exported after its warm-up (a local folder)."""
  return f"{colocated_run[2]}/warmup/hf"


@pytest.fixture(scope="session")
def period_policy(tmp_path_factory) -> str:
  """The HF export (a local folder) of a 200-step warm-up on one-digit sums whose teacher ends half its answers
  with a period: a habit the exact-match reward removes, so greedy held-out accuracy starts near 0 and GRPO lifts
  it within 20 steps (measured over 4 seeds with 2 trainer and 2 rollout hosts: +0.19 to +0.63)."""
  import draccus
  from jaxpod.rl.config import RLConfig
  from jaxpod.rl.run import policy_spec, run_dir, warmup_config
  from jaxpod.train.trainer import train
  cfg = draccus.parse(RLConfig, args=[*TINY, "--problems.teacher_period", "0.5", "--warmup.steps", "200",
                                      "--warmup.batch_size", "32", "--warmup.lr", "3e-3",
                                      "--trainer.runs_dir", str(tmp_path_factory.mktemp("rl_period"))])
  folder = run_dir(cfg)
  train(warmup_config(cfg, folder, policy_spec(cfg, folder)))
  return f"{folder}/warmup/hf"


@pytest.fixture(scope="session")
def calculator_run(tmp_path_factory) -> str:
  """The run folder of a finished `jaxpod rl --problems.type calculator` (colocated, 500 warm-up steps of a teacher that
  skips the tool 60% of the time, then 10 GRPO steps on whole episodes, pass@2 held out)."""
  from jaxpod.cli.main import main
  runs = tmp_path_factory.mktemp("rl_calculator")
  assert main(["rl", *CALCULATOR, "--warmup.steps", "500", "--warmup.batch_size", "32", "--warmup.lr", "3e-3",
               "--trainer.steps", "10", "--trainer.eval_every", "10", "--eval.k", "2",
               "--trainer.runs_dir", str(runs)]) == 0
  [folder] = [p.parent for p in runs.glob("*/summary.json")]
  return str(folder)


@pytest.fixture(scope="session")
def calculator_policy(calculator_run) -> str:
  """The HF checkpoint the calculator run exported after its warm-up (a local folder): it calls the tool."""
  return f"{calculator_run}/warmup/hf"
