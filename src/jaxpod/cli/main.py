"""`jaxpod` entry point: dispatch a subcommand to its module without importing the others.

Each entry names `module:function`; the function receives the remaining argv and returns
an exit code. Keeping imports lazy makes `jaxpod launch` start fast and lets `jaxpod doctor`
set up JAX before anything imports it.
"""
from __future__ import annotations

import importlib
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    # name: (module:function, one-line help)
    "launch": ("jaxpod.cli.launch:main", "run a command as N simulated hosts on this machine"),
    "doctor": ("jaxpod.cli.doctor:main", "check hosts, devices, mesh, collectives, barriers, cache"),
    "cache": ("jaxpod.cli.cache:main", "persistent compile cache: info | clear"),
    "sample": ("jaxpod.cli.sample:main", "generate text from a HF Llama checkpoint on every host"),
    "extract": ("jaxpod.cli.extract:main", "layer activations over a prompt set, per host; info URL"),
    "bench": ("jaxpod.cli.bench:main", "benchmarks: barrier | trm-step | sample | extract | transfer"),
    "train": ("jaxpod.cli.train:main", "train a model (no arguments: a small TRM on 4x4 Sudoku, minutes on CPU)"),
    "plot": ("jaxpod.cli.plot:main", "plot a run's loss and accuracy curves to a PNG: jaxpod plot RUN_DIR"),
    "data": ("jaxpod.cli.data:main", "build Sudoku datasets"),
}


def usage() -> str:
  width = max(len(n) for n in COMMANDS)
  lines = ["usage: jaxpod COMMAND [ARGS...]", "", "commands:"]
  lines += [f"  {n.ljust(width)}  {h}" for n, (_, h) in COMMANDS.items()]
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  if not argv or argv[0] in ("-h", "--help", "help"):
    print(usage())
    return 0
  name, rest = argv[0], argv[1:]
  if name not in COMMANDS:
    print(f"jaxpod: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
    return 2
  module, func = COMMANDS[name][0].split(":")
  code = getattr(importlib.import_module(module), func)(rest)
  return int(code or 0)


if __name__ == "__main__":
  sys.exit(main())
