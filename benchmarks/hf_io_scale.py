"""Per-host bytes and memory of HF checkpoint load and export on simulated hosts over the test GCS server.

    PYTHONPATH=$PWD/src python benchmarks/hf_io_scale.py [--hosts 4] [--shard_mb 256] [--layers 8]

Writes a bf16 Llama (hidden 2048, vocab 32000, 8 layers: ~1 GB) to a bucket of the test GCS server, then runs
`--hosts` processes x 1 device, FSDP over every device: each loads it with `hf_io.load` and exports it with
`hf_io.save` (shards of --shard_mb). Each host counts its downloads and uploads in a TCP proxy of its own in
front of the server (so it measures any version of hf_io the same way), its file writes (wchar) and its peak
resident memory (VmHWM, reset before each phase). Prints a table and JSON. Not a test: ~1 GB per host at worst.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class CountingProxy:
  """A TCP forwarder on 127.0.0.1 counting bytes down (server -> this process) and up."""

  def __init__(self, upstream: str):
    host, port = upstream.split("//")[1].split(":")
    self.target = (host, int(port))
    self.down = self.up = 0
    self.sock = socket.socket()
    self.sock.bind(("127.0.0.1", 0))
    self.sock.listen(64)
    self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
    threading.Thread(target=self._accept, daemon=True).start()

  def _accept(self):
    while True:
      client, _ = self.sock.accept()
      server = socket.create_connection(self.target)
      threading.Thread(target=self._pump, args=(client, server, "up"), daemon=True).start()
      threading.Thread(target=self._pump, args=(server, client, "down"), daemon=True).start()

  def _pump(self, src, dst, kind):
    try:
      while data := src.recv(1 << 20):
        setattr(self, kind, getattr(self, kind) + len(data))
        dst.sendall(data)
    except OSError:
      pass
    finally:
      for s in (src, dst):
        try:
          s.shutdown(socket.SHUT_RDWR)
        except OSError:
          pass


def _status(field: str) -> int:
  with open("/proc/self/status") as f:
    return int(next(l for l in f if l.startswith(field + ":")).split()[1]) * 1024


def _wchar() -> int:
  with open("/proc/self/io") as f:
    return int(next(l for l in f if l.startswith("wchar:")).split()[1])


def worker(ckpt: str, out: str, shard_bytes: int) -> None:
  """One host: load, then export; prints `RESULT {json}`."""
  proxy = CountingProxy(os.environ["STORAGE_EMULATOR_HOST"])
  os.environ["STORAGE_EMULATOR_HOST"] = proxy.url  # before gcsfs makes its first file system
  from jaxpod import runtime
  runtime.init(runtime.RuntimeConfig())
  import jax
  from flax import nnx
  from jaxpod.models.llama import hf_io
  from jaxpod.runtime import make_mesh
  mesh = make_mesh(data=1, fsdp=-1)
  phases = {}

  def measure(name, fn):
    with open("/proc/self/clear_refs", "w") as f:
      f.write("5")
    base, w0, d0, u0, t0 = _status("VmRSS"), _wchar(), proxy.down, proxy.up, time.perf_counter()
    result = fn()
    runtime.barrier(f"bench.{name}", timeout_s=1800)
    phases[name] = {"down": proxy.down - d0, "up": proxy.up - u0, "wchar": _wchar() - w0,
                    "hwm_growth": _status("VmHWM") - base, "seconds": round(time.perf_counter() - t0, 1)}
    return result

  model = measure("load", lambda: hf_io.load(ckpt, mesh))
  model_bytes = sum(x.nbytes for x in jax.tree.leaves(nnx.state(model)))
  measure("export", lambda: hf_io.save(model, out, max_shard_bytes=shard_bytes))
  print("RESULT " + json.dumps({"host": jax.process_index(), "model": model_bytes, **phases}), flush=True)
  runtime.shutdown()


def main(argv) -> None:
  import argparse
  ap = argparse.ArgumentParser()
  ap.add_argument("--hosts", type=int, default=4)
  ap.add_argument("--shard_mb", type=int, default=256)
  ap.add_argument("--layers", type=int, default=8)
  ap.add_argument("--worker", nargs=3)
  a = ap.parse_args(argv)
  if a.worker:
    return worker(a.worker[0], a.worker[1], int(a.worker[2]))
  sys.path.insert(0, str(ROOT))
  import fsspec
  from tests.gcs_server import GCSServer
  from jaxpod.models.llama import LlamaConfig, hf_io, init
  from jaxpod.runtime.launcher import LaunchConfig, launch
  cfg = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=a.layers,
                    num_attention_heads=16, num_key_value_heads=8, dtype="bfloat16")
  with GCSServer() as server, tempfile.TemporaryDirectory() as tmp:
    os.environ.update(server.env())
    bucket = server.new_bucket("bench")
    hf_io.save(init(cfg, seed=0), f"{tmp}/ckpt")
    fsspec.filesystem("gs").put(f"{tmp}/ckpt", f"{bucket}/ckpt", recursive=True)
    ckpt_bytes = sum(f.stat().st_size for f in Path(f"{tmp}/ckpt").glob("*.safetensors"))
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("JAX_NUM_CPU_DEVICES", None)
    r = launch([sys.executable, __file__, "--worker", f"{bucket}/ckpt", f"{bucket}/out", str(a.shard_mb * 2 ** 20)],
               LaunchConfig(hosts=a.hosts, devices_per_host=1, log_dir=f"{tmp}/logs", timeout_s=3000,
                            hosts_root=f"{tmp}/hosts"), env=env, sink=None, summary=None)
    rows = sorted((json.loads(l.split("RESULT ", 1)[1]) for lines in r.output for l in lines
                   if "RESULT " in l), key=lambda x: x["host"])
    files = [f for f in fsspec.filesystem("gs").ls(f"{bucket}/out") if f.endswith(".safetensors")]
  if r.returncode != 0 or len(rows) != a.hosts:
    raise SystemExit(f"hosts failed (exit {r.returncode}); logs were in {tmp}/logs")
  print(f"checkpoint {ckpt_bytes / 2 ** 30:.2f} GiB, {a.hosts} hosts x 1 device, FSDP; export: {len(files)} files")
  print(f"{'host':>4} {'load down':>10} {'load HWM+':>10} {'load s':>7} {'export up':>10} {'export HWM+':>11} "
        f"{'export s':>8}")
  for x in rows:
    m = x["model"]
    ld, ex = x["load"], x["export"]
    print(f"{x['host']:>4} {ld['down'] / ckpt_bytes:>9.2f}x {ld['hwm_growth'] / m:>9.2f}x {ld['seconds']:>7} "
          f"{ex['up'] / m:>9.2f}x {ex['hwm_growth'] / m:>10.2f}x {ex['seconds']:>8}")
  print(json.dumps({"checkpoint_bytes": ckpt_bytes, "files": len(files), "hosts": rows}))


if __name__ == "__main__":
  main(sys.argv[1:])
