"""`jaxpod train [--config_path FILE] [--section.field value ...]`: run the trainer.

With no `--config_path`, the embedded default (`jaxpod/configs/train_default.yaml`: 4x4 Sudoku,
a small TRM, minutes on a laptop CPU) is the base; dotted overrides apply on top of either.
A TRM model file (`configs/trm_*.yaml`: `model:`, `optim:` and a reference-style `train:`
section) is accepted too and translated by `jaxpod.train.config.from_trm_yaml`.
"""
from __future__ import annotations

import tempfile
from importlib import resources

from jaxpod.cli.args import normalise, check_config_file, config_path_of, parse

DEFAULT_CONFIG = "train_default.yaml"


def default_config_path() -> str:
  """Filesystem path of the embedded default config (package data)."""
  return str(resources.files("jaxpod.configs").joinpath(DEFAULT_CONFIG))


def load_config(argv: list[str]):
  """The TrainConfig `jaxpod train ARGV` runs (embedded default unless --config_path; TRM files translated)."""
  from jaxpod.train.config import TrainConfig
  argv = list(argv)
  if any(a in ("-h", "--help") for a in argv):
    return parse(TrainConfig, ["--help"], "jaxpod train")
  path = config_path_of(normalise(argv))
  if path is None:
    argv = ["--config_path", default_config_path(), *argv]
  else:
    check_config_file(path, "jaxpod train")
  with tempfile.TemporaryDirectory() as tmp:
    return parse(TrainConfig, _translate_trm_yaml(argv, tmp), "jaxpod train")


def run(cfg) -> int:
  """`jaxpod train`: hosts and storage checked before JAX initialises (invariants 7, 8), then the trainer."""
  from jaxpod.train.config import validate_for_hosts, validate_storage
  validate_for_hosts(cfg, cfg.runtime.hosts())  # a ValueError here is one line, exit 2
  validate_storage(cfg, cfg.runtime.hosts())  # reachable, and shared with several hosts (StorageError: ValueError)
  from jaxpod.train.trainer import train
  train(cfg)
  return 0


def _translate_trm_yaml(argv: list[str], tmp: str) -> list[str]:
  """Replace a `--config_path` naming a TRM model file by its translation into a TrainConfig file."""
  import yaml
  from jaxpod.train.config import from_trm_yaml
  out = list(argv)
  for i, a in enumerate(out):
    name, eq, value = a.partition("=")
    if name not in ("--config_path", "--config-path"):
      continue
    path = value if eq else (out[i + 1] if i + 1 < len(out) else "")
    translated = from_trm_yaml(path)
    if translated is None:
      return out
    new = f"{tmp}/train_config.yaml"
    with open(new, "w") as f:
      yaml.safe_dump(translated, f)
    if eq:
      out[i] = f"--config_path={new}"
    else:
      out[i + 1] = new
    return out
  return out
