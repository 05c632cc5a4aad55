"""Where the continuous engine's time goes: device ops by named scope, and host-side scheduling.

A run is traced with `jax.profiler.trace`; the trace (an .xplane.pb, parsed with
`jax.profiler.ProfileData`, no TensorBoard) gives each XLA op's time on the CPU threads; the
engine's optimized HLO (its runner compiled ahead of time with `runner.hlo = []`) gives each
op's `op_name`, which carries the model's named scopes. Categories:

  attention   ops under a named scope "attention" (scores, softmax, context over the KV cache)
  matmuls     the other dots (q/k/v/o projections, MLP, vocab head)
  sampling    ops under "sampling" (temperature, top-k/top-p, log-probs, the draw)
  other       everything else on the device (norms, RoPE, embedding, cache writes, control flow)
  host        wall time outside device calls: scheduling, host arrays, Python

Device categories split the device-call time in proportion to their op time (ops on both
threads are summed); host = 1 - device-call time / wall time.

On XLA:CPU with dots on its Eigen runtime (jaxpod's default on x86, `jaxpod/__init__.py`) a dot runs
asynchronously on Eigen's threads and the trace records only its dispatch (a [4096, 1024] x [1024, 1024] dot of
~41 ms shows as 0.13 ms), so "matmuls" is understated and every other share overstated; `EIGEN_DOTS_CAVEAT` says
so beside such a profile. `JAXPOD_XLA_CPU_DOTS=ynn` compiles them as YNNPACK fusions, which the trace times whole.
"""
from __future__ import annotations

import collections
import glob
import os
import re
import tempfile
from typing import Callable

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


def _self_times(xplane: str) -> collections.Counter:
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
    times = _self_times(xplane)
  names = _op_names(hlo_texts)
  by = collections.Counter()
  for (module, op), ns in times.items():
    by[names.get((module, op), "other")] += max(ns, 0)
  total = sum(by.values()) or 1
  return {c: by[c] / total for c in CATEGORIES[:-1]}


def table(shares: dict[str, float], device_s: float, wall_s: float) -> dict[str, float]:
  """Shares of wall time: device categories scaled by device-call time / wall, plus host."""
  device = min(device_s / wall_s, 1.0) if wall_s else 0.0
  return {**{c: shares.get(c, 0.0) * device for c in CATEGORIES[:-1]}, "host": 1.0 - device}
