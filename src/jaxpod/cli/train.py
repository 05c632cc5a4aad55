"""`jaxpod train [--config_path FILE] [--section.field value ...]`: run the trainer.

With no `--config_path`, the embedded default (`jaxpod/configs/train_default.yaml`: 4x4 Sudoku,
a small TRM, minutes on a laptop CPU) is the base; dotted overrides apply on top of either.
"""
from __future__ import annotations

from importlib import resources

from jaxpod.cli.args import parse

DEFAULT_CONFIG = "train_default.yaml"


def default_config_path() -> str:
  """Filesystem path of the embedded default config (package data)."""
  return str(resources.files("jaxpod.configs").joinpath(DEFAULT_CONFIG))


def main(argv: list[str]) -> int:
  from jaxpod.train.config import TrainConfig
  argv = list(argv)
  if not any(a.startswith("--config_path") or a.startswith("--config-path") for a in argv):
    argv = ["--config_path", default_config_path(), *argv]
  cfg = parse(TrainConfig, argv, "jaxpod train")
  from jaxpod.train.trainer import train
  train(cfg)
  return 0
