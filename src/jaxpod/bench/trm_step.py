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


def cli(cfg: TRMStepBench) -> int:
  """Entry of `jaxpod bench trm-step`."""
  run(config_path=cfg.config, batch=cfg.batch, steps=cfg.steps, json_path=cfg.json, runs=cfg.runs,
      compute_dtype=cfg.compute_dtype)
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


def _batch(cfg, batch: int, seed: int = 0):
  import jax.numpy as jnp
  import numpy as np
  rng = np.random.default_rng(seed)
  return {"inputs": jnp.asarray(rng.integers(1, cfg.vocab_size, (batch, cfg.seq_len)), jnp.int32),
          "labels": jnp.asarray(rng.integers(2, cfg.vocab_size, (batch, cfg.seq_len)), jnp.int32),
          "puzzle_identifiers": jnp.asarray(rng.integers(0, cfg.num_puzzle_identifiers, (batch,)), jnp.int32)}


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


def run(config_path: str | None = None, batch: int = 64, steps: int = 5, json_path: str | None = None,
        runs: int = 3, compute_dtype: str | None = "float32", matmul_size: int = 2048) -> dict:
  """Benchmark one config (default: configs/trm_tiny.yaml's preset); prints a table, writes JSON, returns it.

  `compute_dtype` overrides the config's ("float32" by default, to compare with the fp32 matmul
  ceiling; bf16 is emulated and slow on CPU); None keeps the config's. `matmul_size` is the side
  of the square ceiling matmul.
  """
  import jax
  from jaxpod.models import trm
  if batch < 1 or steps < 1 or runs < 1:
    raise ValueError(f"bench trm-step: batch={batch}, steps={steps}, runs={runs} must all be >= 1")
  if config_path:
    cfg, ocfg, _ = trm.load_configs(config_path)
  else:
    cfg, ocfg = trm.TRMConfig.tiny(), trm.TRMOptimConfig()
  if compute_dtype:
    cfg = dataclasses.replace(cfg, compute_dtype=compute_dtype)
  measure_ceiling = matmul_ceiling(matmul_size)
  step, params, opt_state = build_step(cfg, ocfg)
  carry, data = trm.init_carry(cfg, batch), _batch(cfg, batch)
  rng = jax.random.key(0)
  t = time.perf_counter()
  for _ in range(2):  # warm-up: compile, then one steady step
    params, opt_state, carry, metrics = step(params, opt_state, carry, data, rng)
  jax.block_until_ready(metrics)
  warmup_s = time.perf_counter() - t
  flops = trm.step_flops(cfg, batch, train=True)
  per_step, ceilings, fractions = [], [], []
  for _ in range(runs):
    ceilings.append(measure_ceiling())
    t = time.perf_counter()
    for _ in range(steps):
      params, opt_state, carry, metrics = step(params, opt_state, carry, data, rng)
    jax.block_until_ready((params, metrics))
    per_step.append((time.perf_counter() - t) / steps)
    fractions.append(flops / per_step[-1] / ceilings[-1])
  step_s, ceiling = statistics.median(per_step), statistics.median(ceilings)
  result = {
      "benchmark": "trm_step", "config": config_path or "TRMConfig.tiny()", "compute_dtype": cfg.compute_dtype,
      "batch": batch, "steps_per_run": steps, "runs": runs, "params": trm.count_params(params),
      "step_s": step_s, "steps_per_s": 1 / step_s, "examples_per_s": batch / step_s,
      "model_flops_per_step": flops, "achieved_flops_per_s": flops / step_s, "matmul_fp32_flops_per_s": ceiling,
      "fraction_of_matmul": statistics.median(fractions), "fraction_per_run": fractions,
      # Least-disturbed estimate on a shared machine: fastest step over fastest matmul.
      "fraction_best": flops / min(per_step) / max(ceilings),
      "step_s_per_run": per_step, "matmul_flops_per_s_per_run": ceilings, "warmup_s": warmup_s,
      "backend": jax.default_backend(), "devices": len(jax.devices()), "machine": machine(),
  }
  print_table(f"TRM train step ({result['config']}, batch {batch}, {cfg.compute_dtype})",
              ["metric", "value"],
              [("steps/s", result["steps_per_s"]), ("examples/s", result["examples_per_s"]),
               ("model GFLOP/step", flops / 1e9), ("achieved GFLOP/s", flops / step_s / 1e9),
               ("fp32 matmul GFLOP/s", ceiling / 1e9), ("fraction of matmul", result["fraction_of_matmul"]),
               ("fraction (best/best)", result["fraction_best"])])
  write_json(json_path, result)
  return result

