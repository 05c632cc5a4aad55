"""`jaxpod rl [--config_path FILE] [--section.field value ...]`: the options of RL post-training.

With no `--config_path` the embedded default (`jaxpod/configs/rl_default.yaml`: sorting with a
flawed teacher, minutes on a 2-core CPU) is the base; dotted overrides apply on top of it. A
`--problems.type` (formerly `--task.type`, still accepted) with its own embedded default (`rl_calculator.yaml`:
multi-turn episodes need longer contexts) starts from that one instead; any other keeps the default's other
sections but not its `problems:` (the sort fields would not fit another problem set). A `--config_path FILE`
replaces it entirely (the dataclass defaults fill what the file leaves out).
"""
from __future__ import annotations

import os
import tempfile

from jaxpod.cli.args import (check_config_file, config_path_of, embedded_config, fail, normalise, option_value, parse,
                             renamed)

DEFAULT_CONFIG = "rl_default.yaml"
RENAMED = {"rollout.slots": "rollout.batch_size"}  # issue 25: rollout embeds jaxpod.sample's SamplingOptions


def load_config(argv: list[str]):
  """The RLConfig `jaxpod rl ARGV` runs (the embedded default unless --config_path)."""
  from jaxpod.rl.config import RLConfig
  argv = list(argv)
  if any(a in ("-h", "--help") for a in argv):
    return parse(RLConfig, ["--help"], "jaxpod rl")
  path = config_path_of(normalise(argv))
  _refuse_renamed(argv, path)
  if path is not None:
    check_config_file(path, "jaxpod rl")
    return parse(RLConfig, argv, "jaxpod rl")
  with tempfile.TemporaryDirectory() as tmp:
    argv = renamed(RLConfig, normalise(argv), "jaxpod rl", tmp)  # --task.type: --problems.type
    return parse(RLConfig, ["--config_path", _default_for(option_value(argv, "--problems.type"), tmp), *argv],
                 "jaxpod rl")


def _refuse_renamed(argv: list[str], path: str | None) -> None:
  """A renamed option on the command line or in the config file: one line naming its new name, exit 2."""
  import os
  import yaml
  for a in normalise(argv):
    name = a[2:].partition("=")[0] if a.startswith("--") else ""
    if name in RENAMED:
      raise fail("jaxpod rl", f"--{name} was renamed: use --{RENAMED[name]}")
  if path is None or not os.path.isfile(path):
    return
  with open(path) as f:
    raw = yaml.safe_load(f)
  for old, new in RENAMED.items():
    section, key = old.split(".")
    if isinstance(raw, dict) and isinstance(raw.get(section), dict) and key in raw[section]:
      raise fail("jaxpod rl", f"{path}: `{old}` was renamed: write `{new}`")


def _default_for(problems_type: str | None, tmp: str) -> str:
  """The embedded default's path (the problem set's own, `rl_<type>.yaml`, if there is one); for another problem set,
  a copy of it without its `problems:` section."""
  import yaml
  path = embedded_config(DEFAULT_CONFIG)
  if problems_type is None:
    return path
  own = embedded_config(f"rl_{problems_type}.yaml")
  if os.path.isfile(own):
    return own
  with open(path) as f:
    data = yaml.safe_load(f)
  if problems_type == data["problems"]["type"]:
    return path
  del data["problems"]
  out = os.path.join(tmp, DEFAULT_CONFIG)
  with open(out, "w") as f:
    yaml.safe_dump(data, f)
  return out
