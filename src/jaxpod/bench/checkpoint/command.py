"""`jaxpod bench checkpoint`: what one checkpoint costs the training loop, as a ratio of the step time.

A state of `--size-mb` float32 (sharded over this process's devices) is updated by a jitted
step that reads and writes every byte (a stand-in for an optimizer step). One checkpoint's
loop cost is the wall time of `save` plus the steps run until the checkpoint is committed (at
least `--steps`), minus as many median step times: the training time the checkpoint took away,
its background writing included. Two protocols, alternating in rounds:

  orbax commit   jaxpod now: Orbax's async save and its own commit protocol, nothing else
  + crc manifest jaxpod before: the same save, then the leader waits for it and re-reads every
                 byte to write a CRC32 manifest (what the training loop did at each commit)

The store is a local folder by default (`--dir`), or any URL (gs://...).
"""
from __future__ import annotations

import dataclasses
import statistics
import tempfile
import time
import zlib

from jaxpod.bench.common import machine, print_table, write_json


@dataclasses.dataclass(frozen=True)
class CheckpointBench:
  """Options of `jaxpod bench checkpoint`."""

  size_mb: int = 256  # checkpointed state size in MB (float32)
  steps: int = 10  # steps timed after each save at least (more while the background write runs)
  rounds: int = 3  # saves per protocol, alternating
  dir: str | None = None  # checkpoint folder or URL (default: a new temporary folder)
  json: str | None = None  # write the results here

  def __post_init__(self):
    if self.size_mb < 1 or self.steps < 1 or self.rounds < 1:
      raise ValueError("--size-mb, --steps and --rounds must be >= 1")


def _state(size_mb: int):
  import jax
  import jax.numpy as jnp
  from jax.sharding import NamedSharding, PartitionSpec
  from jaxpod import runtime
  mesh = runtime.make_mesh()
  n = jax.device_count()
  rows = max(n, (size_mb * 2 ** 20 // 4) // 4096 // n * n)
  sharding = NamedSharding(mesh, PartitionSpec("data"))
  return {f"w{i}": jax.device_put(jnp.full((rows // 4, 4096), float(i), jnp.float32), sharding) for i in range(4)}


def _crc_all(url: str) -> None:
  from jaxpod.runtime import storage
  fs, root = storage.filesystem(url)
  for path in fs.find(root):
    zlib.crc32(fs.cat_file(path))


def _step_fn():
  import jax
  return jax.jit(lambda s: jax.tree.map(lambda x: x * 0.999 + 0.001, s), donate_argnums=0)


def measure(cfg: CheckpointBench, root: str) -> dict:
  """Loop cost of one checkpoint per protocol (seconds, per round) and the median step time."""
  import jax
  from jaxpod.io import CheckpointConfig, Checkpointer
  from jaxpod.runtime import storage
  step = _step_fn()
  state = step(_state(cfg.size_mb))
  jax.block_until_ready(state)
  times = []
  for _ in range(3 * cfg.steps):
    t = time.perf_counter()
    state = jax.block_until_ready(step(state))
    times.append(time.perf_counter() - t)
  step_s = statistics.median(times)
  costs: dict[str, list[float]] = {"orbax commit": [], "+ crc manifest": []}
  reread: list[float] = []  # seconds of the re-read alone (the part of "before" that scales with state size)
  ckpt = Checkpointer(CheckpointConfig(dir=storage.join(root, "ck"), keep_last=2))
  k = 0
  for _ in range(cfg.rounds):
    for protocol in costs:
      k += 1
      ckpt.wait()  # both protocols start from an idle writer
      t = time.perf_counter()
      ckpt.save(k, state, {"next_index": k})
      if protocol == "+ crc manifest":
        ckpt.wait()
        t_crc = time.perf_counter()
        _crc_all(storage.join(root, "ck", str(k)))
        reread.append(time.perf_counter() - t_crc)
      n = 0
      while n < cfg.steps or ckpt.manager.is_saving_in_progress():
        state = jax.block_until_ready(step(state))
        n += 1
      costs[protocol].append(time.perf_counter() - t - n * step_s)
  ckpt.close()
  return {"step_s": step_s, "costs_s": costs, "reread_s": reread}


def cli(cfg: CheckpointBench) -> int:
  """Entry of `jaxpod bench checkpoint` (one process)."""
  from jaxpod import runtime
  runtime.init()
  with tempfile.TemporaryDirectory(prefix="jaxpod-bench-ckpt-") as tmp:
    result = measure(cfg, cfg.dir or tmp)
  step_s = result["step_s"]
  rows, stats = [], {}
  for protocol, costs in result["costs_s"].items():
    med = statistics.median(costs)
    stats[protocol] = {"cost_s_median": med, "cost_over_step": med / step_s, "costs_s": costs}
    rows.append((protocol, f"{med:.3f}", f"{med / step_s:.1f}"))
  before, now = stats["+ crc manifest"]["cost_s_median"], stats["orbax commit"]["cost_s_median"]
  print_table(f"loop cost of one checkpoint of {cfg.size_mb} MB (median step {step_s * 1e3:.1f} ms)",
              ["protocol", "cost s", "cost / step"], rows)
  reread = statistics.median(result["reread_s"])
  print(f"before / now: {before / max(now, 1e-9):.2f}x; the re-read alone: {reread:.3f} s "
        f"({cfg.size_mb / max(reread, 1e-9):.0f} MB/s, {reread / step_s:.1f} steps)")
  write_json(cfg.json, {"benchmark": "checkpoint", "size_mb": cfg.size_mb, "steps": cfg.steps, "rounds": cfg.rounds,
                        "step_s_median": step_s, "results": stats, "reread_s": result["reread_s"], "baseline": "+ crc manifest",
                        "machine": machine()})
  return 0
