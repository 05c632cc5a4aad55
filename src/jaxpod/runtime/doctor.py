"""`jaxpod doctor`: the first thing to run on a new pod.

Checks, on every host: host discovery, devices, a mesh, one cross-host collective (checked
for the right value), a barrier round trip, a broadcast, the compile cache and the program
check. The leader prints one table; any failed check makes every host exit non-zero.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable

import numpy as np

from jaxpod.runtime import compile_cache, console, control, distributed, program_check, state
from jaxpod.runtime.mesh import describe_mesh, make_mesh


@dataclasses.dataclass(frozen=True)
class DoctorConfig:
  """Options of `jaxpod doctor`."""

  runtime: state.RuntimeConfig = dataclasses.field(default_factory=state.RuntimeConfig)
  barrier_rounds: int = 20  # barrier round trips timed
  timeout_s: float = 60.0  # deadline of each control-plane check


@dataclasses.dataclass
class Check:
  name: str
  ok: bool
  detail: str


def _collective() -> str:
  """psum of (host index + 1) over every device, compared with the value it must have."""
  import jax
  import jax.numpy as jnp
  from jax.sharding import NamedSharding, PartitionSpec as P
  mesh = make_mesh(data=-1)
  sharding = NamedSharding(mesh, P(("data", "fsdp", "model")))
  local = np.full((jax.local_device_count(),), jax.process_index() + 1, np.float32)
  x = jax.make_array_from_process_local_data(sharding, local)
  total = float(jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, P()))(x))
  expected = float(sum((d.process_index + 1) for d in jax.devices()))
  if total != expected:
    raise RuntimeError(f"cross-host sum gave {total}, expected {expected}")
  return f"sum over {jax.device_count()} devices = {total:g} (expected {expected:g})"


def _barrier(rounds: int, timeout: float) -> str:
  ts = []
  for _ in range(rounds):
    t = time.perf_counter()
    control.barrier("doctor.barrier", timeout)
    ts.append(time.perf_counter() - t)
  return f"p50 {np.median(ts) * 1e3:.2f} ms over {rounds} round trips"


def _broadcast(timeout: float) -> str:
  token = control.broadcast(f"{time.time_ns():x}", "doctor.broadcast", timeout)
  seen = control.allgather(token, "doctor.broadcast_check", timeout)
  if len(set(seen)) != 1:
    raise RuntimeError(f"hosts received different broadcast values: {seen}")
  return f"leader value reached {len(seen)} hosts"


def _cache() -> str:
  d = state.cache_dir()
  if d is None:
    return "off (disabled or folder not writable)"
  i = compile_cache.info(d)
  return f"{d}: {i['entries']} files, {i['bytes'] / 1e6:.1f} MB"


def _program_check(timeout: float) -> str:
  import jax.numpy as jnp
  fn = program_check.jit(lambda x: jnp.tanh(x) * 2, name="doctor.probe")
  was = program_check.enabled()
  program_check.enable(True)
  try:
    fn(jnp.ones((8,), jnp.float32))
  finally:
    program_check.enable(was)
  return f"identical programs verified; check is {'ON' if was else 'off'} for jobs (runtime.program_check)"


def run(cfg: DoctorConfig) -> list[Check]:
  """Run every check on this host; returns them (the leader also prints a table)."""
  host = distributed.init(cfg.runtime)
  import jax
  checks: list[Check] = [
      Check("hosts", True, f"{host.label()} via {host.source}; leader: host 0"),
      Check("devices", True, f"{jax.local_device_count()} local, {jax.device_count()} global, "
                             f"platform {jax.devices()[0].platform}"),
  ]
  steps: list[tuple[str, Callable[[], str]]] = [
      ("mesh", lambda: describe_mesh(make_mesh(data=-1))),
      ("collective", _collective),
      ("barrier", lambda: _barrier(cfg.barrier_rounds, cfg.timeout_s)),
      ("broadcast", lambda: _broadcast(cfg.timeout_s)),
      ("compile cache", _cache),
      ("program check", lambda: _program_check(cfg.timeout_s)),
  ]
  for name, fn in steps:
    try:
      checks.append(Check(name, True, fn()))
    except control.PeerFailed:
      raise
    except Exception as e:  # a failed check is reported, not raised
      checks.append(Check(name, False, f"{type(e).__name__}: {e}"))
  # Every host must agree on the verdict, so all exit with the same code.
  failed = control.allgather([c.name for c in checks if not c.ok], "doctor.verdict", cfg.timeout_s)
  for i, names in enumerate(failed):
    if names and i != host.process_index:
      checks.append(Check(f"host {i}", False, "failed: " + ", ".join(names)))
  if host.is_leader:
    _print(checks)
  return checks


def _print(checks: list[Check]) -> None:
  rows = [(c.name, "[green]ok[/]" if c.ok else "[red]FAIL[/]", c.detail) for c in checks]
  console.print_table("jaxpod doctor", ("check", "", "detail"), rows, numbers=False)
