"""RL test fixtures: one tiny colocated `jaxpod rl` run per session, through `run()` (warm-up, GRPO, export).

Its warm-up export is the starting policy of the multi-host tests (`warm_policy`), so the session pays for
one warm-up."""
from __future__ import annotations

import pytest

from tests.rl.clusters import TINY


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
