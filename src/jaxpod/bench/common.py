"""Shared benchmark helpers: percentiles, timing, subprocess runs, JSON output, a `jaxpod rl` run's step figures
(tables: `jaxpod.runtime.console`)."""
from __future__ import annotations

import json
import os
import platform
import statistics
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


def run_jaxpod_rl(args: list[str], log_path: str) -> float:
  """Run `jaxpod rl ARGS` in a fresh process; its wall seconds (output to log_path; raises naming it on failure)."""
  env = dict(os.environ)
  env.pop("JAX_NUM_CPU_DEVICES", None)
  return run_logged(["jaxpod.cli.main", "rl", *args], log_path, f"bench rl: `jaxpod rl {' '.join(args)}`", env)


def rl_run_figures(folder: str) -> dict:
  """Steady-state per-step figures of one finished `jaxpod rl` run folder (steps >= 2: the first steps compile; the
  last step has no interval after it: left out, else its end-of-run evaluation counted as a negative step)."""
  from jaxpod.rl.summary import by_step, read_metrics
  s = json.loads(open(os.path.join(folder, "summary.json")).read())
  records = [r for r in by_step(read_metrics(os.path.join(folder, "train")))
             if r["step"] >= 2 and "reward" in r and "rl/interval_s" in r]
  get = lambda r, k: r.get(k, 0.0)  # noqa: E731
  colocated = s["topology"] == "colocated"
  parts = {k: [get(r, f"rl/{k}_s") for r in records] for k in ("interval", "rollout", "waiting", "publish")}
  evals = [get(r, "eval/seconds") for r in records]
  train = [i - w - p - e for i, w, p, e in zip(parts["interval"], parts["waiting"], parts["publish"], evals)]
  step = [i + (r if colocated else 0.0) - e for i, r, e in zip(parts["interval"], parts["rollout"], evals)]
  workers = s.get("workers") or {}
  fetches = sum(w.get("fetches", 0) for w in workers.values())
  fetch_total = sum(w.get("fetch_s", 0.0) for w in workers.values())
  n = len(records)
  out = {"step_s": statistics.mean(step), "train_s": statistics.mean(train),
         "rollout_s": statistics.mean(parts["rollout"]) if colocated else None,
         "publish_s": statistics.mean(parts["publish"]), "fetch_s": fetch_total / (s["steps"] or 1),
         "fetch_per_version_s": fetch_total / fetches if fetches else 0.0, "waiting_s": statistics.mean(parts["waiting"]),
         "tokens_per_s": s["tokens_per_s"],
         "reward_per_s": sum(r["reward"] for r in records) * s["rows_per_step"] / sum(step),
         "reward_last5": statistics.mean(r["reward"] for r in records[-5:]),
         "accuracy_start": s["accuracy.start"], "accuracy_end": s["accuracy.end"], "steps_measured": n,
         "dropped_stale": records[-1].get("rl/dropped_stale", 0.0),
         "lag": statistics.mean(get(r, "rl/lag") for r in records)}
  out["publish_fetch_over_train"] = (out["publish_s"] + out["fetch_s"]) / out["train_s"] if out["train_s"] > 0 else None
  return out
