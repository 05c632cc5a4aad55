"""`jaxpod train [--config_path FILE] [--section.field value ...]`: run the trainer.

With no `--config_path`, the embedded default (`jaxpod/configs/train_default.yaml`: 4x4 Sudoku,
a small TRM, minutes on a laptop CPU) is the base (with `--task.type preference`, the packaged
`preference_default.yaml`; with another `--task.type`, that task's own defaults are); dotted
overrides apply on top of either.
A TRM model file (`configs/trm_*.yaml`: `model:`, `optim:` and a reference-style `train:`
section) is accepted too and translated by `jaxpod.tasks.trm_sudoku.from_trm_yaml`. The task's
sections live under `task:` (`task: {type: trm_sudoku, data: ..., model: ..., optim: ...}`);
a file or an option that still uses the old top-level `data:`/`model:`/`optim:`/`lm:` gets one
line naming the new key.
"""
from __future__ import annotations

import tempfile

from jaxpod.cli.args import check_config_file, config_path_of, embedded_config, fail, normalise, option_value, parse

DEFAULT_CONFIG = "train_default.yaml"
# `--task.type NAME` with no --config_path: the packaged file that holds that task's default run (the trainer
# section included: a task's built-in default needs its own step count and cadences).
TASK_DEFAULTS = {None: DEFAULT_CONFIG, "trm_sudoku": DEFAULT_CONFIG, "preference": "preference_default.yaml"}
# Sections that moved under `task:` (issue 11): old key -> what to write instead.
MOVED = {"data": "task.data", "model": "task.model", "optim": "task.optim",
         "lm": "task (task: {type: causal_lm, ...}; lm.lr -> task.optim.lr, lm.text_path -> task.data.text_path, "
               "lm.sample_max_new_tokens -> task.sample.max_new_tokens; see configs/lm_tiny.yaml)"}


def load_config(argv: list[str]):
  """The TrainConfig `jaxpod train ARGV` runs (embedded default unless --config_path; TRM files translated)."""
  from jaxpod.train.config import TrainConfig
  argv = list(argv)
  if any(a in ("-h", "--help") for a in argv):
    return parse(TrainConfig, ["--help"], "jaxpod train")
  path = config_path_of(normalise(argv))
  if path is None:
    default = TASK_DEFAULTS.get(option_value(normalise(argv), "--task.type"))  # other tasks: their own defaults
    if default is not None:
      argv = ["--config_path", embedded_config(default), *argv]
  else:
    check_config_file(path, "jaxpod train")
  with tempfile.TemporaryDirectory() as tmp:
    argv = _translate_trm_yaml(argv, tmp)
    _refuse_moved_keys(argv)
    return parse(TrainConfig, argv, "jaxpod train")


def _refuse_moved_keys(argv: list[str]) -> None:
  """An old top-level section in the config file or an option: one line naming the new key, exit 2."""
  import yaml
  for a in normalise(argv):
    head = a[2:].partition("=")[0].split(".")[0] if a.startswith("--") and "." in a else None
    if head in MOVED:
      name = a[2:].partition("=")[0]
      new = f"--task.{name}" if head != "lm" else MOVED["lm"]
      raise fail("jaxpod train", f"--{name} moved under task: use {new}")
  path = config_path_of(normalise(argv))
  if path:
    with open(path) as f:
      raw = yaml.safe_load(f) or {}
    for key in MOVED:
      if key in raw:
        raise fail("jaxpod train", f"{path}: top-level `{key}:` moved under `task:`; write it as {MOVED[key]} "
                   "(task: {type: trm_sudoku, data: ..., model: ..., optim: ...})")


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
  from jaxpod.tasks.trm_sudoku import from_trm_yaml
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
