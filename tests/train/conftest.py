"""Tiny training configs shared by the trainer tests (seconds per run on 2 CPU cores)."""
from __future__ import annotations

import pytest


def tiny_args(runs_dir, data_dir, steps: int = 8, **overrides) -> list[str]:
  """CLI overrides for a tiny 4x4 run: 1 block, 2 ACT steps, global batch 16."""
  values = {
      "task.data.box": "2x2", "task.data.num_train": 64, "task.data.num_test": 32, "task.data.augmentations": 8,
      "task.data.global_batch_size": 16, "task.data.eval_batch_size": 16, "task.data.cache_dir": str(data_dir),
      "task.model.seq_len": 16, "task.model.vocab_size": 6, "task.model.hidden_size": 32, "task.model.num_heads": 2,
      "task.model.puzzle_emb_ndim": 32, "task.model.puzzle_emb_len": 1, "task.model.h_cycles": 1, "task.model.l_cycles": 1,
      "task.model.l_layers": 1, "task.model.halt_max_steps": 2, "task.model.mlp_t": "false", "task.model.pos_encodings": "rope",
      "task.optim.lr": 3e-3, "task.optim.puzzle_emb_lr": 3e-3, "task.optim.warmup_steps": 2, "task.optim.weight_decay": 0.01,
      "trainer.steps": steps, "trainer.log_every": 1, "trainer.ema": 0.5, "trainer.runs_dir": str(runs_dir),
      "trainer.progress": "false", "trainer.plot": "false", "tracker.tensorboard": "false",
      "runtime.compile_cache.min_compile_time_s": 0,
  }
  values.update({k.replace("__", "."): v for k, v in overrides.items()})
  return [f"--{k}={v}" for k, v in values.items() if v is not None]  # None: leave the field at its default


def tiny_config(runs_dir, data_dir, steps: int = 8, **overrides):
  """A TrainConfig parsed exactly as `jaxpod train` parses the command line."""
  from jaxpod.cli.args import parse
  from jaxpod.train import TrainConfig
  return parse(TrainConfig, tiny_args(runs_dir, data_dir, steps, **overrides), "test")


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
  """One dataset cache for the whole session (the tiny dataset is built once)."""
  return tmp_path_factory.mktemp("sudoku_data")
