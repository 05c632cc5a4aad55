"""`jaxpod cache info|clear [--dir DIR] [--runs-dir DIR]`: the persistent compile cache."""
from __future__ import annotations

import dataclasses
import sys

from jaxpod.cli.args import parse
from jaxpod.runtime import compile_cache


@dataclasses.dataclass(frozen=True)
class CacheCommand:
  """Options of `jaxpod cache`."""

  dir: str | None = None  # cache folder; default: the one `jaxpod train` uses (sibling of runs_dir)
  runs_dir: str = "runs"  # runs folder whose sibling is the default cache


def main(argv: list[str]) -> int:
  if not argv or argv[0] not in ("info", "clear"):
    print("usage: jaxpod cache info|clear [--dir DIR]", file=sys.stderr)
    return 2
  cfg = parse(CacheCommand, argv[1:], f"jaxpod cache {argv[0]}")
  path = cfg.dir or compile_cache.default_dir(cfg.runs_dir)
  if argv[0] == "info":
    i = compile_cache.info(path)
    state = "exists" if i["exists"] else "does not exist yet"
    print(f"compile cache {i['dir']} ({state}): {i['entries']} files, {i['bytes'] / 1e6:.1f} MB")
  else:
    print(f"removed {compile_cache.clear(path)} files from {path}")
  return 0
