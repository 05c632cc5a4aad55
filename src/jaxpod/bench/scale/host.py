"""One simulated host of `jaxpod bench scale`: load, train step, publish and export of one model, each
phase measured on this process alone (run by `jaxpod launch`, see `bench/scale/command.py`).

Per phase: bytes downloaded and uploaded (a counting TCP proxy of this host's own in front of the GCS
server: gcsfs reads sockets with `recv`, which `/proc/<pid>/io` does not count), bytes written to local
files (`wchar`; gloo's collective traffic counts there too), peak resident memory above the phase's
start (`VmHWM`, reset through `/proc/self/clear_refs`), and seconds. Prints `RESULT {json}`.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time


class CountingProxy:
  """A TCP forwarder on 127.0.0.1 counting the bytes down (server -> this process) and up."""

  def __init__(self, upstream: str):
    host, port = upstream.split("//")[1].split(":")
    self.target = (host, int(port))
    self.down = self.up = 0
    self._lock = threading.Lock()
    self.sock = socket.socket()
    self.sock.bind(("127.0.0.1", 0))
    self.sock.listen(64)
    self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
    threading.Thread(target=self._accept, daemon=True).start()

  def _accept(self) -> None:
    while True:
      client, _ = self.sock.accept()
      server = socket.create_connection(self.target)
      threading.Thread(target=self._pump, args=(client, server, "up"), daemon=True).start()
      threading.Thread(target=self._pump, args=(server, client, "down"), daemon=True).start()

  def _pump(self, src, dst, kind: str) -> None:
    try:
      while data := src.recv(1 << 20):
        with self._lock:
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


class Phases:
  """Measures named phases of this host; every host enters each phase together (a barrier ends it)."""

  def __init__(self, proxy: CountingProxy):
    self.proxy, self.rows = proxy, {}

  def measure(self, name: str, fn):
    from jaxpod import runtime
    from jaxpod.runtime.procstats import io_bytes, reset_peak, status_bytes
    reset_peak()
    base = status_bytes("VmRSS")
    w0, d0, u0, t0 = io_bytes("wchar"), self.proxy.down, self.proxy.up, time.perf_counter()
    out = fn()
    seconds = time.perf_counter() - t0
    runtime.barrier(f"bench.scale.{name}", timeout_s=3600)
    self.rows[name] = {"down": self.proxy.down - d0, "up": self.proxy.up - u0,
                       "wchar": io_bytes("wchar") - w0, "hwm_growth": status_bytes("VmHWM") - base, "seconds": round(seconds, 2)}
    return out


def train_step(model, batch_per_host: int, seq: int):
  """The model after one AdamW step of the causal-LM loss on random tokens, the optimizer state sharded like
  the params (the step's peak memory is what the phase measures)."""
  import jax
  import numpy as np
  import optax
  from flax import nnx
  from jaxpod.models.llama.loss import loss_and_grad
  graphdef, params = nnx.split(model)
  opt = optax.adamw(1e-4)
  shardings = jax.tree.map(lambda x: x.sharding, params)
  opt_state = jax.jit(opt.init, out_shardings=None)(params)
  grad_fn = loss_and_grad(graphdef)

  def step(p, s, tokens):
    (loss, _), g = grad_fn(p, tokens)
    updates, s = opt.update(g, s, p)
    return optax.apply_updates(p, updates), s, loss

  mesh = jax.tree.leaves(shardings)[0].mesh
  batch = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(mesh.axis_names))
  hosts = jax.process_count()
  rows = np.random.default_rng(jax.process_index()).integers(0, 1000, (batch_per_host, seq), np.int32)
  tokens = jax.make_array_from_process_local_data(batch, rows, (batch_per_host * hosts, seq))
  params, opt_state, loss = jax.jit(step, donate_argnums=(0, 1), out_shardings=(shardings, None, None))(
      params, opt_state, tokens)
  jax.block_until_ready(loss)
  return nnx.merge(graphdef, params)


def publish(model, folder: str, hosts_per_replica: int) -> dict:
  """Publish the params through the checkpoint transport from a mesh that replicates them over groups of
  hosts (data = hosts / hosts_per_replica); returns this host's served bytes."""
  import jax
  from flax import nnx
  from jaxpod.runtime import make_mesh, state_shardings
  from jaxpod.transfer import TransferConfig, create_server
  hosts = jax.process_count()
  mesh = make_mesh(data=hosts // hosts_per_replica, fsdp=-1)
  params = nnx.state(model, nnx.Param)
  params = jax.jit(lambda p: p, out_shardings=state_shardings(params, mesh))(params)
  with create_server(TransferConfig(mode="checkpoint", folder=folder, keep_n=1)) as server:
    m = server.publish(1, params)
  return {"served": m.nbytes}


def main(argv: list[str]) -> None:
  ckpt, out, shard_bytes, batch, seq, hosts_per_replica = argv[0], argv[1], int(argv[2]), int(argv[3]), \
      int(argv[4]), int(argv[5])
  proxy = CountingProxy(os.environ["STORAGE_EMULATOR_HOST"])
  os.environ["STORAGE_EMULATOR_HOST"] = proxy.url  # before gcsfs makes its first file system
  from jaxpod import runtime
  runtime.init(runtime.RuntimeConfig())
  import jax
  from flax import nnx
  from jaxpod.models.llama import hf_io
  from jaxpod.runtime import make_mesh
  phases = Phases(proxy)
  model = phases.measure("load", lambda: hf_io.load(ckpt, make_mesh(data=1, fsdp=-1)))
  model_bytes = sum(x.nbytes for x in jax.tree.leaves(nnx.state(model)))
  model = phases.measure("train_step", lambda: train_step(model, batch, seq))
  served = phases.measure("publish", lambda: publish(model, f"{out}/weights", hosts_per_replica))
  phases.measure("export", lambda: hf_io.save(model, f"{out}/hf", max_shard_bytes=shard_bytes))
  print("RESULT " + json.dumps({"host": jax.process_index(), "model": model_bytes, **served, **phases.rows}),
        flush=True)
  runtime.shutdown()


if __name__ == "__main__":
  main(sys.argv[1:])
