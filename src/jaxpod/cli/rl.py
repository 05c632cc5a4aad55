"""`jaxpod rl [--config_path FILE] [--section.field value ...]`: the options of RL post-training.

With no `--config_path` the embedded default (`jaxpod/configs/rl_default.yaml`: sorting with a
flawed teacher, minutes on a 2-core CPU) is the base; dotted overrides apply on top of it. A
`--config_path FILE` replaces it entirely (the dataclass defaults fill what the file leaves out).
"""
from __future__ import annotations

from importlib import resources

from jaxpod.cli.args import check_config_file, config_path_of, normalise, parse

DEFAULT_CONFIG = "rl_default.yaml"


def default_config_path() -> str:
  """Filesystem path of the embedded default config (package data)."""
  return str(resources.files("jaxpod.configs").joinpath(DEFAULT_CONFIG))


def load_config(argv: list[str]):
  """The RLConfig `jaxpod rl ARGV` runs (the embedded default unless --config_path)."""
  from jaxpod.rl.config import RLConfig
  argv = list(argv)
  if any(a in ("-h", "--help") for a in argv):
    return parse(RLConfig, ["--help"], "jaxpod rl")
  path = config_path_of(normalise(argv))
  if path is None:
    argv = ["--config_path", default_config_path(), *argv]
  else:
    check_config_file(path, "jaxpod rl")
  return parse(RLConfig, argv, "jaxpod rl")
