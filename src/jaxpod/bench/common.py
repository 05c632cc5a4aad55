"""Shared benchmark helpers: percentiles, timing, subprocess runs, JSON output, a `jaxpod rl` run's step figures,
where a traced run's device time goes (the sampler's and the GRPO step's profiles), a synthetic multi-turn
environment (tables: `jaxpod.runtime.console`)."""
from __future__ import annotations

import collections
import glob
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
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


# ---------------------------------------------------------------------------- profile: device time by category
# Where a traced run's time goes (the continuous engine's in `jaxpod bench sample`, the GRPO train step's in
# `jaxpod bench rl --profile true`): device ops by named scope, and host-side scheduling.
#
# A run is traced with `jax.profiler.trace`; the trace (an .xplane.pb, parsed with
# `jax.profiler.ProfileData`, no TensorBoard) gives each XLA op's time on the CPU threads; the
# engine's optimized HLO (its runner compiled ahead of time with `runner.hlo = []`) gives each
# op's `op_name`, which carries the model's named scopes. Categories:
#
#   attention   ops under a named scope "attention" (scores, softmax, context over the KV cache)
#   matmuls     the other dots (q/k/v/o projections, MLP, vocab head)
#   sampling    ops under "sampling" (temperature, top-k/top-p, log-probs, the draw)
#   other       everything else on the device (norms, RoPE, embedding, cache writes, control flow)
#   host        wall time outside device calls: scheduling, host arrays, Python
#
# Device categories split the device-call time in proportion to their op time (ops on both
# threads are summed); host = 1 - device-call time / wall time.
#
# On XLA:CPU with dots on its Eigen runtime (jaxpod's default on x86, `jaxpod/__init__.py`) a dot runs
# asynchronously on Eigen's threads and the trace records only its dispatch (a [4096, 1024] x [1024, 1024] dot of
# ~41 ms shows as 0.13 ms), so "matmuls" is understated and every other share overstated; `EIGEN_DOTS_CAVEAT` says
# so beside such a profile. `JAXPOD_XLA_CPU_DOTS=ynn` compiles them as YNNPACK fusions, which the trace times whole.

CATEGORIES = ("attention", "matmuls", "sampling", "other", "host")
EIGEN_DOTS_CAVEAT = ("matmuls understated: XLA:CPU's Eigen dots run asynchronously and the trace holds only their "
                     "dispatch; JAXPOD_XLA_CPU_DOTS=ynn profiles them whole")


def eigen_dots(flags: str | None = None, backend: str | None = None) -> bool:
  """True when this process's XLA:CPU runs dots on Eigen (an empty YNN fusion list): its dots are not timed in a trace."""
  import jax
  from jaxpod import CPU_DOT_FLAG
  flags = os.environ.get("XLA_FLAGS", "") if flags is None else flags
  backend = jax.default_backend() if backend is None else backend
  values = re.findall(re.escape(CPU_DOT_FLAG) + r"(\S*)", flags)  # the option's values, in order: XLA takes the last
  return backend == "cpu" and bool(values) and values[-1] == ""


def _op_names(hlo_texts: list[str]) -> dict[tuple[str, str], str]:
  """(module, instruction) -> its category, over every module's optimized HLO."""
  out = {}
  for text in hlo_texts:
    module = re.match(r"HloModule (\S+?),", text)
    module = module.group(1) if module else "?"
    for m in re.finditer(r"^\s*(?:ROOT )?%?([\w.\-]+) = (?:\([^=]*?\)|\S+) ([\w\-]+)\((.*)$", text, re.M):
      name, opcode, rest = m.groups()
      meta = re.search(r'op_name="([^"]*)"', rest)
      out[(module, name)] = _category(name, opcode, meta.group(1) if meta else "", rest)
  return out


def _category(op: str, opcode: str, op_name: str, rest: str) -> str:
  if "/attention/" in op_name or (opcode == "dot" and "lhs_batch_dims" in rest):  # batched dots: over the KV cache
    return "attention"
  if "/sampling/" in op_name:
    return "sampling"
  if opcode == "dot" or "dot_general" in op_name or op.startswith("ynn_fusion"):
    return "matmuls"
  return "other"


def self_times(xplane: str) -> collections.Counter:
  """(module, op) -> nanoseconds of the op itself (children nested on the same thread subtracted)."""
  from jax.profiler import ProfileData
  out: collections.Counter = collections.Counter()
  for plane in ProfileData.from_file(xplane).planes:
    for line in plane.lines:
      events = []
      for e in line.events:
        stats = dict(e.stats)
        if "hlo_op" in stats:
          events.append((e.start_ns, e.start_ns + e.duration_ns, stats["hlo_op"], stats.get("hlo_module", "")))
      events.sort(key=lambda x: (x[0], -x[1]))
      stack: list = []
      for start, end, op, module in events:
        while stack and stack[-1][1] <= start:
          stack.pop()
        if stack:
          out[(stack[-1][3], stack[-1][2])] -= end - start
        out[(module, op)] += end - start
        stack.append((start, end, op, module))
  return out


def device_shares(run: Callable[[], object], hlo_texts: list[str]) -> dict[str, float]:
  """Traced `run()`: each device category's share of the device op time (sums to 1)."""
  import jax
  with tempfile.TemporaryDirectory(prefix="jaxpod-profile-") as folder:
    with jax.profiler.trace(folder):
      run()
    xplane = glob.glob(f"{folder}/**/*.xplane.pb", recursive=True)[0]
    times = self_times(xplane)
  names = _op_names(hlo_texts)
  by = collections.Counter()
  for (module, op), ns in times.items():
    by[names.get((module, op), "other")] += max(ns, 0)
  total = sum(by.values()) or 1
  return {c: by[c] / total for c in CATEGORIES[:-1]}


def wall_shares(shares: dict[str, float], device_s: float, wall_s: float) -> dict[str, float]:
  """Shares of wall time: device categories scaled by device-call time / wall, plus host."""
  device = min(device_s / wall_s, 1.0) if wall_s else 0.0
  return {**{c: shares.get(c, 0.0) * device for c in CATEGORIES[:-1]}, "host": 1.0 - device}


# ---------------------------------------------------------------------------- a synthetic multi-turn environment
class Synthetic:
  """A synthetic environment: a 16-token observation after every turn, never done (6 turns: the turn limit)."""

  def reset(self, problem):
    self.turn = 0
    return problem.prompt

  def step(self, completion):
    self.turn += 1
    return f"observation {self.turn:03d}\n", 0.0, False
