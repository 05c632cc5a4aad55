"""`jaxpod bench transfer --size 1GiB [--trainer-hosts 2] [--clients 4] [--modes ...]`: weight transfer.

A trainer (one process, or `trainer_hosts` simulated hosts under jaxpod's launcher, each serving
its own shards) publishes a model of `size` bytes (16 fp32 parameters) and `clients` client
processes receive it at once, `rounds` times per mode after WARMUP untimed rounds (see
`roles.py`). Reported per mode (medians over rounds): publish seconds; receive GB/s in
aggregate (every client's bytes over the span from the first fetch start to the last client
done) and per client; the whole transfer (publish + that span); every phase on both sides;
beside this machine's memcpy and one-stream loopback TCP throughput measured in the same run.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
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


def _median_phases(ms: list[dict]) -> dict[str, float]:
  return {k: statistics.median(m["phases"].get(k, 0.0) for m in ms) for k in ms[0]["phases"]}


def _start_trainer(cfg_json: str, size: int, sync: str, total: int, hosts: int, env: dict):
  """The trainer: a subprocess, or `hosts` simulated hosts (1 device each) under jaxpod's launcher."""
  argv = [sys.executable, "-m", "jaxpod.bench.transfer.roles", "trainer", cfg_json, str(size), sync, str(total)]
  if hosts == 1:
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL)
    return proc.poll, proc.wait
  from jaxpod.runtime.launcher import LaunchConfig, launch
  env = {k: v for k, v in env.items() if k != "JAX_NUM_CPU_DEVICES"}  # the launcher sets devices per host
  token = os.path.expanduser("~/.ray/auth_token")  # isolated hosts have their own HOME (see the launcher)
  if os.path.isfile(token):
    env["RAY_AUTH_TOKEN_PATH"] = token
  cfg = LaunchConfig(hosts=hosts, devices_per_host=1, log_dir=os.path.join(sync, "trainer_logs"), timeout_s=1800)
  box: list = []
  thread = threading.Thread(target=lambda: box.append(launch(argv, cfg, sink=io.StringIO(), summary=io.StringIO(),
                                                              env=env)), daemon=True)
  thread.start()

  def wait(timeout=None):
    thread.join(timeout)
    if box and box[0].returncode != 0:
      raise RuntimeError(f"bench trainer hosts failed: {box[0].all_output[-2000:]}")
  return (lambda: None if thread.is_alive() else (box[0].returncode if box else 1)), wait


def bench_mode(mode: str, size: int, rounds: int, folder: str, ray_address: str | None, trainer_hosts: int = 1,
               clients: int = 1) -> dict:
  """Median figures of one mode: a trainer of `trainer_hosts` hosts, `clients` clients receiving at once."""
  from jaxpod.bench.transfer import roles
  total = rounds + WARMUP
  cfg = json.dumps(dict(mode=mode, name=f"bench_{os.getpid()}_{mode}", ray_namespace="jaxpod_bench",
                        folder=os.path.join(folder, mode), keep_n=2, receive_timeout_s=300.0, publish_timeout_s=300.0,
                        **({"coordinator": "filesystem"} if mode != "ray" else {})))
  sync = tempfile.mkdtemp(prefix=f"jaxpod-bench-{mode}-")
  env = dict(os.environ, JAXPOD_BENCH_RAY=(ray_address or "") if mode == "ray" else "", JAX_PLATFORMS="cpu",
             JAX_NUM_CPU_DEVICES="1")
  trainer_poll, trainer_wait = _start_trainer(cfg, size, sync, total, trainer_hosts, env)
  procs = [subprocess.Popen([sys.executable, "-m", "jaxpod.bench.transfer.roles", "client", cfg, str(size), sync,
                             str(total), str(i)], env=env, stdout=subprocess.DEVNULL) for i in range(clients)]
  alive = lambda: trainer_poll() is None and all(p.poll() is None or p.returncode == 0 for p in procs)  # noqa: E731
  rows = []
  try:
    for i in range(clients):
      roles.wait_file(os.path.join(sync, f"ready_{i}"), 300, alive)
    for r in range(1, total + 1):
      open(os.path.join(sync, f"round_{r}"), "w").close()
      pubs = [_load(os.path.join(sync, f"published_{r}_{h}.json"), alive) for h in range(trainer_hosts)]
      got = [_load(os.path.join(sync, f"client_{i}_{r}.json"), alive) for i in range(clients)]
      if r > WARMUP:
        rows.append((pubs, got))
  finally:
    open(os.path.join(sync, "stop"), "w").close()
    for p in procs:
      p.wait(timeout=120)
    trainer_wait(120)
  return _summary(mode, trainer_hosts, clients, rows)


def _load(path: str, alive) -> dict:
  from jaxpod.bench.transfer.roles import wait_file
  wait_file(path, 600, alive)
  with open(path) as f:
    return json.load(f)


def _summary(mode: str, trainer_hosts: int, clients: int, rows: list) -> dict:
  nbytes = sum(p["bytes"] for p in rows[0][0])
  publish = [max(p["seconds"] for p in pubs) for pubs, _ in rows]
  spans = [max(c["end"] for c in got) - min(c["end"] - c["seconds"] for c in got) for _, got in rows]
  per_client = [nbytes / c["seconds"] / 1e9 for _, got in rows for c in got]
  whole = [p + s for p, s in zip(publish, spans)]
  servers = [pubs[0] for pubs, _ in rows]
  client_ms = [c for _, got in rows for c in got]
  sp, cp = _median_phases(servers), _median_phases(client_ms)
  return {"mode": mode, "trainer_hosts": trainer_hosts, "clients": clients, "bytes": nbytes,
          "seconds": statistics.median(whole), "gb_per_s": nbytes / statistics.median(whole) / 1e9,
          "publish_s": statistics.median(publish), "receive_span_s": statistics.median(spans),
          "aggregate_gb_per_s": statistics.median(clients * nbytes / s / 1e9 for s in spans),
          "per_client_gb_per_s": statistics.median(per_client), "per_client_min_gb_per_s": min(per_client),
          "server_phases_s": sp, "client_phases_s": cp,
          "server_phases_gb_per_s": {k: servers[0]["bytes"] / v / 1e9 for k, v in sp.items() if v > 0},
          "client_phases_gb_per_s": {k: nbytes / v / 1e9 for k, v in cp.items() if v > 0},
          "rounds": len(rows), "round_seconds": whole}


def run(size_bytes: int, modes: list[str] | tuple[str, ...] | None = None, json_path: str | None = None,
        rounds: int = 3, folder: str | None = None, trainer_hosts: int = 1, clients: int = 1) -> dict:
  """Benchmark every mode at `size_bytes`; prints a table, writes JSON, returns the results."""
  from jaxpod.transfer.config import MODES
  modes = list(modes or MODES)
  if trainer_hosts < 1 or clients < 1:
    raise ValueError(f"--trainer-hosts={trainer_hosts} and --clients={clients} must be >= 1")
  results = {"size_bytes": size_bytes, "machine": common.machine(), "trainer_hosts": trainer_hosts, "clients": clients,
             "memcpy_gb_per_s": memcpy_gbps(size_bytes), "loopback_tcp_gb_per_s": loopback_tcp_gbps(size_bytes),
             "modes": {}}
  folder = folder or tempfile.mkdtemp(prefix="jaxpod-bench-transfer-", dir="/dev/shm" if os.path.isdir(
      "/dev/shm") else None)
  results["checkpoint_folder"] = folder
  with contextlib.ExitStack() as stack:
    ray_address = None
    if "ray" in modes:  # on 127.0.0.1, never the machine's network address
      from jaxpod.transfer import ray_local
      require("ray", "`jaxpod bench transfer` mode 'ray'")
      ray_address = stack.enter_context(ray_local.local_cluster(
          num_cpus=1, include_dashboard=False, object_store_memory=max(5 * size_bytes, 1 << 30), log_to_driver=False))
    for mode in modes:
      results["modes"][mode] = bench_mode(mode, size_bytes, rounds, folder, ray_address, trainer_hosts, clients)
  _print(results)
  common.write_json(json_path, results)
  return results


def _phases(d: dict) -> str:
  return " ".join(f"{k} {v:.2f}" for k, v in d.items())


def _print(results: dict) -> None:
  rows = [["memcpy (baseline)", "", "", f"{results['memcpy_gb_per_s']:.2f}", "", ""],
          ["loopback TCP, 1 stream", "", "", f"{results['loopback_tcp_gb_per_s']:.2f}", "", ""]]
  for mode, r in results["modes"].items():
    rows.append([mode, f"{r['publish_s']:.3f}", f"{r['gb_per_s']:.2f}", f"{r['aggregate_gb_per_s']:.2f}",
                 f"{r['per_client_gb_per_s']:.2f} (min {r['per_client_min_gb_per_s']:.2f})",
                 _phases(r["client_phases_gb_per_s"])])
  common.print_table(f"weight transfer, {results['size_bytes'] / 2**30:.2f} GiB, trainer hosts "
                     f"{results['trainer_hosts']}, clients {results['clients']} (medians; GB/s)",
                     ["mode", "publish s", "whole GB/s", "aggregate GB/s", "per client GB/s", "client phases"], rows)


@dataclasses.dataclass(frozen=True)
class TransferBench:
  """Options of `jaxpod bench transfer`."""

  size: str = "1GiB"  # model bytes (16 fp32 parameters)
  modes: str = "checkpoint,ray,jax_transfer,arrow_flight"  # comma-separated modes
  rounds: int = 3  # timed rounds per mode (after the warm-up rounds)
  trainer_hosts: int = 1  # trainer hosts (simulated by jaxpod's launcher), each serving its own shards
  clients: int = 1  # client processes receiving every version at once (fan-out)
  json: str | None = None  # write the results here


def cli(cfg: TransferBench) -> int:
  """Entry of `jaxpod bench transfer`."""
  run(parse_size(cfg.size), [m for m in cfg.modes.split(",") if m], cfg.json, rounds=cfg.rounds,
      trainer_hosts=cfg.trainer_hosts, clients=cfg.clients)
  return 0

