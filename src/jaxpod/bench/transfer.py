"""`jaxpod bench transfer --size 1GiB [--modes ...] [--json PATH]`: weight transfer per mode.

A trainer subprocess publishes a model of `size` bytes (16 fp32 parameters) and this process
receives it, `rounds` times per mode after WARMUP untimed rounds. Reported per mode (medians): the
whole transfer (publish + receive, seconds and GB/s) and every phase on both sides, beside
this machine's memcpy and one-stream loopback TCP throughput measured in the same run.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from jaxpod.bench import common
from jaxpod.runtime.extras import require

N_PARAMS = 16
# Untimed rounds first: connections, compilation, and the first touch of the shared-memory and
# page-cache pages that later rounds reuse (a fresh 1 GiB buffer costs ~0.5 s of page faults
# here); the timed rounds are the steady state of a trainer that publishes every few steps.
WARMUP = 2


def parse_size(text: str) -> int:
  """'1GiB', '256MiB', '64KiB', '1e9' -> bytes."""
  m = re.fullmatch(r"\s*([\d.e+]+)\s*(KiB|MiB|GiB|KB|MB|GB|B)?\s*", text)
  if not m:
    raise ValueError(f"size={text!r}: use a number with an optional unit, e.g. 1GiB or 256MiB")
  unit = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "KB": 10**3, "MB": 10**6, "GB": 10**9}.get(m.group(2), 1)
  return int(float(m.group(1)) * unit)


def memcpy_gbps(size: int, repeats: int = 5) -> float:
  """Median GB/s of one numpy copy of `size` bytes."""
  src, dst = np.ones(size, np.uint8), np.empty(size, np.uint8)
  np.copyto(dst, src)
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    np.copyto(dst, src)
    times.append(time.perf_counter() - t)
  return size / statistics.median(times) / 1e9


def loopback_tcp_gbps(size: int, repeats: int = 3) -> float:
  """Median GB/s of one TCP stream over 127.0.0.1 (sender and receiver threads)."""
  src, dst = np.ones(size, np.uint8), np.empty(size, np.uint8)
  times = []
  for _ in range(repeats):
    with socket.create_server(("127.0.0.1", 0)) as listener:
      port = listener.getsockname()[1]
      done = threading.Event()

      def receive():
        conn, _ = listener.accept()
        view, got = memoryview(dst), 0
        while got < size:
          n = conn.recv_into(view[got:], min(size - got, 16 << 20))
          if n == 0:
            break
          got += n
        conn.close()
        done.set()
      t = threading.Thread(target=receive)
      t.start()
      with socket.create_connection(("127.0.0.1", port)) as s:
        start = time.perf_counter()
        s.sendall(memoryview(src))
        done.wait()
        times.append(time.perf_counter() - start)
      t.join()
  return size / statistics.median(times) / 1e9


def _shapes(size: int) -> list[tuple[int, int]]:
  rows = max(1, size // (N_PARAMS * 1024 * 4))
  return [(rows, 1024)] * N_PARAMS


def serve() -> None:
  """Trainer subprocess: `publish` each weight id read from stdin, reply with the metrics."""
  import jax
  import jax.numpy as jnp
  from jaxpod import transfer
  cfg = transfer.TransferConfig(**json.loads(sys.argv[1]))
  if os.environ.get("JAXPOD_BENCH_RAY"):
    import ray
    ray.init(address=os.environ["JAXPOD_BENCH_RAY"], log_to_driver=False)
  params = {f"layer{i}": jnp.full(s, float(i), jnp.float32) for i, s in enumerate(_shapes(int(sys.argv[2])))}
  params = jax.block_until_ready(params)
  with transfer.create_server(cfg) as server:
    print("@@ready", flush=True)
    for line in sys.stdin:
      m = server.publish(int(line), params)
      print("@@" + json.dumps(m.as_dict()), flush=True)
  os._exit(0)


def _reply(proc) -> str:
  for raw in proc.stdout:
    line = raw.decode()
    if line.startswith("@@"):
      return line[2:].strip()
  raise RuntimeError(f"bench trainer exited with {proc.wait()}")


def _median_phases(ms: list[dict]) -> dict[str, float]:
  return {k: statistics.median(m["phases"].get(k, 0.0) for m in ms) for k in ms[0]["phases"]}


def bench_mode(mode: str, size: int, rounds: int, folder: str, ray_address: str | None) -> dict:
  """Median whole-transfer and per-phase figures of one mode."""
  import jax
  from jaxpod import transfer
  cfg = dict(mode=mode, name=f"bench_{os.getpid()}_{mode}", ray_namespace="jaxpod_bench", folder=os.path.join(folder, mode), keep_n=1,
             receive_timeout_s=300.0, publish_timeout_s=300.0)
  env = dict(os.environ, JAXPOD_BENCH_RAY=ray_address or "")
  proc = subprocess.Popen([sys.executable, "-c", "from jaxpod.bench.transfer import serve; serve()",
                           json.dumps(cfg), str(size)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
  try:
    _reply(proc)
    like = {f"layer{i}": jax.ShapeDtypeStruct(s, np.float32, sharding=jax.sharding.SingleDeviceSharding(
        jax.devices()[0])) for i, s in enumerate(_shapes(size))}
    servers, clients = [], []
    with transfer.create_client(transfer.TransferConfig(**cfg)) as client:
      for r in range(rounds + WARMUP):
        proc.stdin.write(f"{r + 1}\n".encode())
        proc.stdin.flush()
        server_m = json.loads(_reply(proc))
        update = client.receive(like, wait=120.0)
        if update is None or update.weight_id != r + 1:
          raise RuntimeError(f"mode {mode}: round {r + 1} not received")
        if r >= WARMUP:
          servers.append(server_m)
          clients.append(update.metrics.as_dict())
        del update
  finally:
    proc.stdin.close()
    proc.wait(timeout=60)
  nbytes = servers[0]["bytes"]
  totals = [s["seconds"] + c["seconds"] for s, c in zip(servers, clients)]
  total = statistics.median(totals)
  sp, cp = _median_phases(servers), _median_phases(clients)
  return {"mode": mode, "bytes": nbytes, "seconds": total, "gb_per_s": nbytes / total / 1e9,
          "publish_s": statistics.median(s["seconds"] for s in servers),
          "receive_s": statistics.median(c["seconds"] for c in clients),
          "server_phases_s": sp, "client_phases_s": cp,
          "server_phases_gb_per_s": {k: nbytes / v / 1e9 for k, v in sp.items() if v > 0},
          "client_phases_gb_per_s": {k: nbytes / v / 1e9 for k, v in cp.items() if v > 0},
          "rounds": len(totals), "round_seconds": totals}


def run(size_bytes: int, modes: list[str] | tuple[str, ...] | None = None, json_path: str | None = None,
        rounds: int = 3, folder: str | None = None) -> dict:
  """Benchmark every mode at `size_bytes`; prints a table, writes JSON, returns the results."""
  from jaxpod.transfer.config import MODES
  modes = list(modes or MODES)
  results = {"size_bytes": size_bytes, "machine": common.machine(),
             "memcpy_gb_per_s": memcpy_gbps(size_bytes), "loopback_tcp_gb_per_s": loopback_tcp_gbps(size_bytes),
             "modes": {}}
  ray_address = None
  needs_ray = any(m != "checkpoint" for m in modes)
  if needs_ray:
    ray = require("ray", "`jaxpod bench transfer` modes other than checkpoint")
    ray.init(num_cpus=1, include_dashboard=False, object_store_memory=max(5 * size_bytes, 1 << 30),
             log_to_driver=False)
    ray_address = ray.get_runtime_context().gcs_address
  folder = folder or tempfile.mkdtemp(prefix="jaxpod-bench-transfer-", dir="/dev/shm" if os.path.isdir(
      "/dev/shm") else None)
  results["checkpoint_folder"] = folder
  try:
    for mode in modes:
      results["modes"][mode] = bench_mode(mode, size_bytes, rounds, folder, ray_address)
  finally:
    if needs_ray:
      ray.shutdown()
  _print(results)
  common.write_json(json_path, results)
  return results


def _phases(d: dict) -> str:
  return " ".join(f"{k} {v:.2f}" for k, v in d.items())


def _print(results: dict) -> None:
  rows = [["memcpy (baseline)", "", f"{results['memcpy_gb_per_s']:.2f}", "", ""],
          ["loopback TCP, 1 stream", "", f"{results['loopback_tcp_gb_per_s']:.2f}", "", ""]]
  for mode, r in results["modes"].items():
    rows.append([mode, f"{r['seconds']:.3f}", f"{r['gb_per_s']:.2f}",
                 _phases(r["server_phases_gb_per_s"]), _phases(r["client_phases_gb_per_s"])])
  common.print_table(f"weight transfer, {results['size_bytes'] / 2**30:.2f} GiB (medians; phases in GB/s)",
                     ["mode", "seconds", "GB/s", "trainer phases", "client phases"], rows)


@dataclasses.dataclass(frozen=True)
class TransferBench:
  """Options of `jaxpod bench transfer`."""

  size: str = "1GiB"  # model bytes (16 fp32 parameters)
  modes: str = "checkpoint,ray,jax_transfer,arrow_flight"  # comma-separated modes
  rounds: int = 3  # timed rounds per mode (after one warm-up)
  json: str | None = None  # write the results here


def cli(cfg: TransferBench) -> int:
  """Entry of `jaxpod bench transfer`."""
  run(parse_size(cfg.size), [m for m in cfg.modes.split(",") if m], cfg.json, rounds=cfg.rounds)
  return 0

