"""Shared benchmark helpers: percentiles, timing, JSON output (tables: `jaxpod.runtime.console`)."""
from __future__ import annotations

import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from jaxpod.runtime.console import print_table  # noqa: F401 - the benchmarks' table printer


def percentiles(samples_s: Sequence[float]) -> dict[str, float]:
  """p50/p90/p99/mean in milliseconds."""
  a = np.asarray(samples_s) * 1e3
  return {"p50_ms": float(np.percentile(a, 50)), "p90_ms": float(np.percentile(a, 90)),
          "p99_ms": float(np.percentile(a, 99)), "mean_ms": float(a.mean()), "n": int(a.size)}


def time_calls(fn: Callable[[int], Any], n: int, warmup: int = 10) -> list[float]:
  """Seconds per call of fn(i), after `warmup` untimed calls."""
  for i in range(warmup):
    fn(-1 - i)
  out = []
  for i in range(n):
    t = time.perf_counter()
    fn(i)
    out.append(time.perf_counter() - t)
  return out


def run_logged(module_args: list[str], log_path: str, what: str, env: dict | None = None) -> float:
  """Run `python -m MODULE ARGS` with its output in log_path; its wall seconds; RuntimeError naming the log on failure."""
  t = time.perf_counter()
  with open(log_path, "w") as log:
    proc = subprocess.run([sys.executable, "-m", *module_args], stdout=log, stderr=subprocess.STDOUT, env=env)
  if proc.returncode:
    tail = open(log_path).read()[-3000:]
    raise RuntimeError(f"{what} failed (exit {proc.returncode}); log {log_path}:\n{tail}")
  return time.perf_counter() - t


def machine() -> dict[str, Any]:
  import os
  return {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()}


def write_json(path: str | None, payload: dict) -> None:
  """Write the results as JSON when a path is given."""
  if path:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(payload, indent=2))
