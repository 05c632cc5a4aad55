"""`jaxpod bench trm-step`: TRM training-step throughput against this machine's fp32 matmul ceiling.

One timed step = one ACT step of the global batch: forward (h_cycles x (l_cycles + 1) calls of
the shared network), backward through the last cycle, AdamATan2 + SignSGD update, jitted once
with donated state. The ceiling is a large jitted fp32 matmul timed in the same run, right before
each timed run of TRM steps (so both see the same machine load; the fraction is per run). Each
figure is the median over the timed runs after warm-up. Model FLOPs are analytic (matmuls only).
"""
from __future__ import annotations

import dataclasses
import statistics
import time

from jaxpod.bench.common import machine, print_table, write_json


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


def cli(cfg: TRMStepBench) -> int:
  """Entry of `jaxpod bench trm-step`."""
  run(config_path=cfg.config, batch=cfg.batch, steps=cfg.steps, json_path=cfg.json, runs=cfg.runs,
      compute_dtype=cfg.compute_dtype, reference=cfg.reference, threads=cfg.threads)
  return 0


def matmul_ceiling(n: int = 2048, runs: int = 3):
  """A function measuring FLOP/s of a jitted fp32 [n, n] @ [n, n] (median of `runs`), already warmed up."""
  import jax
  import jax.numpy as jnp
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
  f = jax.jit(lambda x, y: x @ y)
  f(a, b).block_until_ready()

  def measure() -> float:
    times = []
    for _ in range(runs):
      t = time.perf_counter()
      f(a, b).block_until_ready()
      times.append(time.perf_counter() - t)
    return 2 * n ** 3 / statistics.median(times)
  return measure


def make_batches(cfg, batch: int, n: int = 4, seed: int = 0) -> list[dict]:
  """`n` Sudoku-shaped int32 NumPy batches (labels 2..V-1, 60% of inputs blank), cycled by both sides."""
  import numpy as np
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(n):
    labels = rng.integers(2, cfg.vocab_size, (batch, cfg.seq_len)).astype(np.int32)
    inputs = np.where(rng.random((batch, cfg.seq_len)) < 0.6, 1, labels).astype(np.int32)
    out.append({"inputs": inputs, "labels": labels,
                "puzzle_identifiers": rng.integers(0, cfg.num_puzzle_identifiers, (batch,)).astype(np.int32)})
  return out


def build_step(cfg, ocfg):
  """(jitted train step (params, opt_state, carry, batch, rng) -> same + metrics, initial state)."""
  import jax
  from flax import nnx
  from jaxpod.models import trm
  model = nnx.jit(lambda: trm.TRM(cfg, rngs=nnx.Rngs(0)))()
  graphdef, params, buffers = trm.split_model(model)
  tx = trm.make_optimizer(ocfg)

  def step(params, opt_state, carry, batch, rng):
    grad_fn = jax.value_and_grad(trm.train_loss, argnums=1, has_aux=True)
    (_, (carry, _, metrics)), grads = grad_fn(graphdef, params, buffers, carry, batch, rng)
    updates, opt_state = tx.update(grads, opt_state, params)
    return jax.tree.map(lambda p, u: p + u, params, updates), opt_state, carry, metrics
  return jax.jit(step, donate_argnums=(0, 1, 2)), params, jax.jit(tx.init)(params)


def _load(config_path: str | None, compute_dtype: str | None):
  from jaxpod.models import trm
  if config_path:
    cfg, ocfg, _ = trm.load_configs(config_path)
  else:
    cfg, ocfg = trm.TRMConfig.tiny(), trm.TRMOptimConfig()
  if compute_dtype:
    cfg = dataclasses.replace(cfg, compute_dtype=compute_dtype)
  return cfg, ocfg


class JaxpodTimer:
  """The jitted jaxpod step, warmed up; `time_run()` -> (seconds per step, matmul FLOP/s right before)."""

  def __init__(self, cfg, ocfg, batches: list, steps: int, matmul_size: int):
    import jax
    import jax.numpy as jnp
    from jaxpod.models import trm
    self.steps, self.measure_ceiling = steps, matmul_ceiling(matmul_size)
    self.step, self.params, self.opt_state = build_step(cfg, ocfg)
    self.carry = trm.init_carry(cfg, batches[0]["inputs"].shape[0])
    self.batches = [{k: jnp.asarray(v) for k, v in b.items()} for b in batches]
    self.rng, self.i = jax.random.key(0), 0
    t = time.perf_counter()
    for _ in range(2):  # warm-up: compile, then one steady step
      self._one()
    jax.block_until_ready(self.params)
    self.warmup_s = time.perf_counter() - t

  def _one(self):
    batch = self.batches[self.i % len(self.batches)]
    self.i += 1
    self.params, self.opt_state, self.carry, self.metrics = self.step(
        self.params, self.opt_state, self.carry, batch, self.rng)

  def time_run(self) -> tuple[float, float]:
    import jax
    ceiling = self.measure_ceiling()
    t = time.perf_counter()
    for _ in range(self.steps):
      self._one()
    jax.block_until_ready((self.params, self.metrics))
    return (time.perf_counter() - t) / self.steps, ceiling


def run(config_path: str | None = None, batch: int = 64, steps: int = 5, json_path: str | None = None,
        runs: int = 3, compute_dtype: str | None = "float32", matmul_size: int = 2048,
        reference: str | None = None, threads: int = 0) -> dict:
  """Benchmark one config (default: the tiny preset); prints a table, writes JSON, returns it.

  `compute_dtype` overrides the config's ("float32" by default, to compare with the fp32 matmul
  ceiling; bf16 is emulated and slow on CPU); None keeps the config's. `matmul_size` is the side
  of the square ceiling matmul. With `reference` (a TinyRecursiveModels checkout) each side runs
  in its own process, warmed once, and the two alternate `runs` times (see `compare.py`);
  `threads` sets torch's thread count there (0: torch's default).
  """
  import jax
  from jaxpod.models import trm
  if batch < 1 or steps < 1 or runs < 1:
    raise ValueError(f"bench trm-step: batch={batch}, steps={steps}, runs={runs} must all be >= 1")
  cfg, ocfg = _load(config_path, compute_dtype)
  flops = trm.step_flops(cfg, batch, train=True)
  if reference:
    from jaxpod.bench.trm.compare import compare
    per_step, ceilings, extra = compare(config_path, compute_dtype, cfg, ocfg, make_batches(cfg, batch), steps, runs,
                                        matmul_size, reference, threads)
  else:
    timer = JaxpodTimer(cfg, ocfg, make_batches(cfg, batch), steps, matmul_size)
    per_step, ceilings = map(list, zip(*[timer.time_run() for _ in range(runs)]))
    extra = {"params": trm.count_params(timer.params), "warmup_s": timer.warmup_s}
  fractions = [flops / s / c for s, c in zip(per_step, ceilings)]
  step_s, ceiling = statistics.median(per_step), statistics.median(ceilings)
  result = {
      "benchmark": "trm_step", "config": config_path or "TRMConfig.tiny()", "compute_dtype": cfg.compute_dtype,
      "batch": batch, "steps_per_run": steps, "runs": runs,
      "step_s": step_s, "steps_per_s": 1 / step_s, "examples_per_s": batch / step_s,
      "model_flops_per_step": flops, "achieved_flops_per_s": flops / step_s, "matmul_fp32_flops_per_s": ceiling,
      "fraction_of_matmul": statistics.median(fractions), "fraction_per_run": fractions,
      # Least-disturbed estimate on a shared machine: fastest step over fastest matmul.
      "fraction_best": flops / min(per_step) / max(ceilings),
      "step_s_per_run": per_step, "matmul_flops_per_s_per_run": ceilings,
      "backend": jax.default_backend(), "devices": len(jax.devices()), "machine": machine(), **extra,
  }
  rows = [("jaxpod examples/s", result["examples_per_s"]), ("jaxpod steps/s", result["steps_per_s"]),
          ("model GFLOP/step", flops / 1e9), ("achieved GFLOP/s", flops / step_s / 1e9),
          ("fp32 matmul GFLOP/s", ceiling / 1e9), ("fraction of matmul", result["fraction_of_matmul"]),
          ("fraction (best/best)", result["fraction_best"])]
  if reference:
    rows[1:1] = [("reference examples/s", batch / result["reference"]["step_s"]),
                 ("jaxpod / reference", result["jaxpod_over_reference"]),
                 ("reference fraction of matmul", flops / result["reference"]["step_s"] / ceiling)]
  print_table(f"TRM train step ({result['config']}, batch {batch}, {cfg.compute_dtype})", ["metric", "value"], rows)
  write_json(json_path, result)
  return result


def _worker(argv: list[str]) -> int:
  """`python -m jaxpod.bench.trm.step SPEC.json`: the jaxpod side of a comparison (stdin: run / quit)."""
  import json
  import sys
  import numpy as np
  from jaxpod.models import trm
  with open(argv[0]) as f:
    spec = json.load(f)
  cfg, ocfg = _load(spec["config"], spec["compute_dtype"])
  batches = [{k: np.asarray(v, np.int32) for k, v in b.items()} for b in spec["batches"]]
  timer = JaxpodTimer(cfg, ocfg, batches, spec["steps"], spec["matmul_size"])
  print(json.dumps({"ready": True, "warmup_s": timer.warmup_s, "params": trm.count_params(timer.params)}), flush=True)
  for line in sys.stdin:
    if line.strip() != "run":
      break
    step_s, ceiling = timer.time_run()
    print(json.dumps({"step_s": step_s, "matmul_flops_per_s": ceiling}), flush=True)
  return 0


if __name__ == "__main__":
  import sys
  sys.exit(_worker(sys.argv[1:]))
