"""RL test fixtures: a warm policy exported once per session."""
from __future__ import annotations

import pytest

from tests.rl.clusters import TINY


@pytest.fixture(scope="session")
def warm_policy(tmp_path_factory) -> str:
  """A HF checkpoint of a tiny policy after a short supervised warm-up (local folder)."""
  import draccus
  from jaxpod.rl.config import RLConfig
  from jaxpod.rl.run import warmup_config
  from jaxpod.train.trainer import train
  runs = tmp_path_factory.mktemp("warm")
  cfg = draccus.parse(RLConfig, args=[*TINY, "--warmup.steps", "60", "--warmup.batch_size", "16", "--warmup.lr",
                                      "3e-3", "--trainer.runs_dir", str(runs)])
  train(warmup_config(cfg, str(runs / "w")))
  return str(runs / "w" / "warmup" / "hf")


