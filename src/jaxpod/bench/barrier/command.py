"""`jaxpod bench barrier`: jaxpod's barrier vs the raw coordination-service barrier vs
`multihost_utils.sync_global_devices` (a device collective), same processes, same run.

Runs inside every host of a `jaxpod launch` job (the CLI launches it); host 0 reports.
The three kinds are interleaved in rounds so machine noise hits them alike.
"""
from __future__ import annotations

import dataclasses

from jaxpod import runtime
from jaxpod.bench.common import machine, percentiles, print_table, write_json
from jaxpod.runtime import kv


@dataclasses.dataclass(frozen=True)
class BarrierBench:
  """Options of `jaxpod bench barrier`."""

  hosts: int = 4  # simulated hosts (the CLI relaunches itself under `jaxpod launch`)
  iters: int = 300  # barriers timed per kind per round
  rounds: int = 3  # interleaved rounds (noise hits every kind alike)
  json: str | None = None  # write the results here


def measure(iters: int, rounds: int) -> dict[str, list[float]]:
  """Per-call seconds of each barrier kind, pooled over rounds."""
  from jax.experimental import multihost_utils
  from jaxpod.bench.common import time_calls
  samples: dict[str, list[float]] = {"jaxpod": [], "raw_client": [], "sync_global_devices": []}
  for r in range(rounds):
    samples["raw_client"] += time_calls(lambda i: kv.raw_barrier(f"bench/raw/{r}/{i}", 60), iters)
    samples["jaxpod"] += time_calls(lambda i: runtime.barrier("bench.jaxpod", 60), iters)
    samples["sync_global_devices"] += time_calls(
        lambda i: multihost_utils.sync_global_devices(f"bench_sync_{r}_{i}"), max(iters // 4, 10))
  return samples


def main(iters: int = 300, rounds: int = 3, json_path: str | None = None) -> dict:
  """Run on every host; host 0 prints the table and writes JSON."""
  host = runtime.init()
  if not host.multi_process:
    raise ValueError("bench barrier needs several hosts; run it as `jaxpod bench barrier --hosts 4`")
  runtime.barrier("bench.start", 120)
  samples = measure(iters, rounds)
  stats = {k: percentiles(v) for k, v in samples.items()}
  base = stats["raw_client"]["p50_ms"]
  for v in stats.values():
    v["p50_vs_raw"] = v["p50_ms"] / base
  payload = {"benchmark": "barrier", "hosts": host.process_count, "iters": iters, "rounds": rounds,
             "baseline": "raw_client", "results": stats, "machine": machine()}
  if host.is_leader:
    rows = [(k, v["p50_ms"], v["p99_ms"], v["p50_vs_raw"]) for k, v in stats.items()]
    print_table(f"barrier latency, {host.process_count} hosts", ["kind", "p50 ms", "p99 ms", "p50 / raw"], rows)
    write_json(json_path, payload)
  runtime.barrier("bench.end", 120)
  return payload


def cli(cfg: BarrierBench) -> int:
  """Entry of `jaxpod bench barrier` (on every host of the launch)."""
  main(iters=cfg.iters, rounds=cfg.rounds, json_path=cfg.json)
  return 0
