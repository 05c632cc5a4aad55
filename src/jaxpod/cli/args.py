"""Config parsing shared by every subcommand: draccus (`--config_path FILE`, dotted overrides).

Dashes in option names are accepted (`--devices-per-host` == `--devices_per_host`). A bad
value ends the command with one line naming the field, before anything expensive runs.
"""
from __future__ import annotations

import sys
from typing import TypeVar

import draccus

T = TypeVar("T")


class UsageError(SystemExit):
  """Bad command-line input: printed as one line, exit code 2."""


def _normalise(argv: list[str]) -> list[str]:
  out = []
  for a in argv:
    if a.startswith("--") and not a.startswith("--config"):
      name, eq, value = a[2:].partition("=")
      a = "--" + name.replace("-", "_") + eq + value
    elif a.startswith("--config-path"):
      a = a.replace("--config-path", "--config_path", 1)
    out.append(a)
  return out


def parse(cls: type[T], argv: list[str], prog: str) -> T:
  """Parse argv into the frozen dataclass `cls`; one clear line and exit 2 on bad input."""
  if any(a in ("-h", "--help") for a in argv):
    draccus.parse(cls, args=["--help"], prog=prog)  # prints help and exits 0
  try:
    return draccus.parse(cls, args=_normalise(argv), prog=prog)
  except SystemExit:
    raise
  except (ValueError, TypeError, FileNotFoundError, draccus.utils.DecodingError, draccus.utils.ParsingError) as e:
    while isinstance(e, draccus.utils.ParsingError) and e.__cause__ is not None:
      e = e.__cause__  # the dataclass's own message names the field and the fix
    print(f"{prog}: error: {e}", file=sys.stderr)
    raise UsageError(2) from None


def split_command(argv: list[str]) -> tuple[list[str], list[str]]:
  """(options, command) around the first '--'."""
  if "--" in argv:
    i = argv.index("--")
    return argv[:i], argv[i + 1:]
  return argv, []
