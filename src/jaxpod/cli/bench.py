"""`jaxpod bench NAME [options]`: benchmarks that print a table and write JSON.

Multi-host benchmarks re-launch themselves under `jaxpod launch` when started outside one.
"""
from __future__ import annotations

import dataclasses
import importlib
import os
import sys

from jaxpod.cli.args import parse
from jaxpod.runtime import hosts as hosts_lib


@dataclasses.dataclass(frozen=True)
class BarrierBench:
  """Options of `jaxpod bench barrier`."""

  hosts: int = 4  # simulated hosts
  iters: int = 300  # barriers timed per kind per round
  rounds: int = 3  # interleaved rounds (noise hits every kind alike)
  json: str | None = None  # write the results here


def _inside_launch() -> bool:
  return hosts_lib.ENV_PROCESS_ID in os.environ


def barrier(argv: list[str]) -> int:
  cfg = parse(BarrierBench, argv, "jaxpod bench barrier")
  if not _inside_launch():
    from jaxpod.runtime.launcher import LaunchConfig, launch
    cmd = [sys.executable, "-m", "jaxpod.cli.main", "bench", "barrier", *argv]
    return launch(cmd, LaunchConfig(hosts=cfg.hosts), echo_hosts={0}).returncode
  from jaxpod.bench.barrier import main as run
  run(iters=cfg.iters, rounds=cfg.rounds, json_path=cfg.json)
  return 0


@dataclasses.dataclass(frozen=True)
class TRMStepBench:
  """Options of `jaxpod bench trm-step`."""

  config: str | None = None  # TRM model YAML (e.g. configs/trm_sudoku_mlp.yaml); default: the tiny preset
  batch: int = 64  # global batch of the timed train step
  steps: int = 5  # train steps per timed run
  runs: int = 3  # timed runs (the median is reported)
  compute_dtype: str = "float32"  # forward dtype; bf16 is emulated (slow) on CPU
  json: str | None = None  # write the results here
  reference: str | None = None  # a TinyRecursiveModels checkout: time its own step too (needs jaxpod[bench])
  threads: int = 0  # torch threads of the reference side (0: torch's default)


def trm_step(argv: list[str]) -> int:
  cfg = parse(TRMStepBench, argv, "jaxpod bench trm-step")
  from jaxpod.bench.trm_step import run
  run(config_path=cfg.config, batch=cfg.batch, steps=cfg.steps, json_path=cfg.json, runs=cfg.runs,
      compute_dtype=cfg.compute_dtype, reference=cfg.reference, threads=cfg.threads)
  return 0


# name -> "module:function(argv) -> int"; workloads register their benchmark here.
BENCHES = {
    "sample": "jaxpod.bench.sample:cli",
    "barrier": "jaxpod.cli.bench:barrier",
    "trm-step": "jaxpod.cli.bench:trm_step",
    "transfer": "jaxpod.bench.transfer:cli",
    "extract": "jaxpod.cli.extract:bench",
}


def main(argv: list[str]) -> int:
  if not argv or argv[0] not in BENCHES:
    print(f"usage: jaxpod bench {{{'|'.join(BENCHES)}}} [options]", file=sys.stderr)
    return 2
  module, func = BENCHES[argv[0]].split(":")
  return int(getattr(importlib.import_module(module), func)(argv[1:]) or 0)
