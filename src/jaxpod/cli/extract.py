"""`jaxpod extract`: layer activations over a prompt set, and `jaxpod extract info URL`.

    jaxpod extract --model DIR --prompts FILE --layers 4,8 --out URL [--points resid,attn_out,mlp_out]
                   [--batch-size B] [--max-seq-len T] [--dtype bf16|f32] [--mesh.model 2 ...]
    jaxpod launch --hosts 4 --devices-per-host 2 -- jaxpod extract ...     # simulated hosts
    jaxpod extract info URL
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys

from jaxpod.cli.args import parse

LIST_OPTIONS = ("layers", "points")


def _lists(argv: list[str]) -> list[str]:
  """`--layers 4,8` -> `--layers [4,8]` (draccus reads tuples in brackets)."""
  out, wrap_next = [], False
  for a in argv:
    name, eq, value = a.partition("=")
    bare = name.lstrip("-").replace("-", "_")
    if wrap_next and not a.startswith("--") and not a.startswith("["):
      a = f"[{a}]"
    elif a.startswith("--") and bare in LIST_OPTIONS and eq and not value.startswith("["):
      a = f"{name}=[{value}]"
    wrap_next = a.startswith("--") and bare in LIST_OPTIONS and not eq
    out.append(a)
  return out


def main(argv: list[str]) -> int:
  if argv and argv[0] == "info":
    return info(argv[1:])
  from jaxpod import extract, runtime
  cfg = parse(extract.ExtractConfig, _lists(argv), "jaxpod extract")
  try:
    stats = extract.run(cfg)
  except (ValueError, FileNotFoundError) as e:  # bad input: one line, exit 2
    print(f"jaxpod extract: error: {e}", file=sys.stderr)
    return 2
  except runtime.PeerFailed as e:
    print(f"jaxpod extract: {e}", file=sys.stderr)
    return 1
  if runtime.is_leader():
    s = stats["seconds"]
    work = sum(v for k, v in s.items() if k != "setup")
    print(f"jaxpod extract: {stats['rows']} samples, {stats['tokens']} tokens in {work:.1f}s "
          f"({stats['tokens'] / max(work, 1e-9):.0f} tok/s) -> {cfg.out}")
  return 0


@dataclasses.dataclass(frozen=True)
class InfoConfig:
  """Options of `jaxpod extract info`."""

  url: str = ""  # dataset folder or URL
  json: bool = False  # print the summary as JSON


def info(argv: list[str]) -> int:
  """Print a dataset summary; exit 1 if rows are missing or repeated."""
  if argv and not argv[0].startswith("-"):
    argv = ["--url", argv[0], *argv[1:]]
  cfg = parse(InfoConfig, argv, "jaxpod extract info")
  from jaxpod import extract
  try:
    ds = extract.open(cfg.url, strict=False)
  except FileNotFoundError as e:
    print(f"jaxpod extract info: error: {e}", file=sys.stderr)
    return 2
  summary = ds.summary()
  if cfg.json:
    print(json.dumps(summary, indent=1))
  else:
    from rich.console import Console
    from rich.table import Table
    t = Table(title=f"activation dataset {cfg.url}", show_header=False)
    for k, v in summary.items():
      t.add_row(k, json.dumps(v) if isinstance(v, (dict, list)) else str(v))
    Console().print(t)
  return 0 if ds.completeness.ok else 1


def bench(argv: list[str]) -> int:
  """`jaxpod bench extract [--json PATH]` (registered in jaxpod.cli.bench.BENCHES)."""
  from jaxpod.bench.extract import BenchConfig, run
  from jaxpod.runtime import hosts as hosts_lib
  cfg = parse(BenchConfig, argv, "jaxpod bench extract")
  if cfg.hosts > 1 and hosts_lib.ENV_PROCESS_ID not in os.environ:
    from jaxpod.runtime.launcher import LaunchConfig, launch
    cmd = [sys.executable, "-m", "jaxpod.cli.main", "bench", "extract", *argv]
    return launch(cmd, LaunchConfig(hosts=cfg.hosts, devices_per_host=cfg.devices_per_host), echo_hosts={0}).returncode
  options = dataclasses.asdict(cfg)
  run(json_path=options.pop("json"), **options)
  return 0
