"""`jaxpod launch --hosts N [--devices-per-host M] [--log-dir D] -- CMD ...`"""
from __future__ import annotations

import sys

from jaxpod.cli.args import parse, split_command
from jaxpod.runtime.launcher import LaunchConfig, launch


def main(argv: list[str]) -> int:
  opts, cmd = split_command(argv)
  cfg = parse(LaunchConfig, opts, "jaxpod launch")
  if not cmd:
    print("jaxpod launch: error: no command; usage: jaxpod launch --hosts 2 -- CMD ARGS...", file=sys.stderr)
    return 2
  try:
    return launch(cmd, cfg).returncode
  except ValueError as e:
    print(f"jaxpod launch: error: {e}", file=sys.stderr)
    return 2
