"""The processes of `jaxpod bench transfer`: a trainer (1 process, or N hosts under jaxpod's
launcher) and inference clients, each its own OS process, paced through files in a sync folder.

    python -m jaxpod.bench.transfer.roles trainer CFG_JSON SIZE SYNC ROUNDS
    python -m jaxpod.bench.transfer.roles client CFG_JSON SIZE SYNC ROUNDS INDEX

Round r: the driver drops `round_<r>`; every trainer host publishes weight id r (each host its
own shards) and writes `published_<r>_<host>.json` (its metrics); each client receives id r and
writes `client_<i>_<r>.json` (its metrics and the wall-clock end of its receive). `stop` ends
the trainer. Clients write `ready_<i>` once connected, so start-up is never timed.
"""
from __future__ import annotations

import json
import os
import sys
import time

N_PARAMS = 16


def shapes(size: int) -> list[tuple[int, int]]:
  """16 fp32 (rows, 1024) parameters totalling about `size` bytes (rows even: they split over hosts)."""
  rows = max(2, size // (N_PARAMS * 1024 * 4)) // 2 * 2
  return [(rows, 1024)] * N_PARAMS


def write_json(path: str, obj: dict) -> None:
  """Write then rename, so a reader never sees half a file."""
  with open(path + ".tmp", "w") as f:
    json.dump(obj, f)
  os.replace(path + ".tmp", path)


def wait_file(path: str, timeout_s: float, proc_ok=lambda: True) -> None:
  """Wait for `path`; raise naming it at the deadline or when `proc_ok()` turns False."""
  deadline = time.monotonic() + timeout_s
  while not os.path.exists(path):
    if time.monotonic() > deadline or not proc_ok():
      raise RuntimeError(f"bench transfer: {path} did not appear (a trainer or client process failed or hung)")
    time.sleep(0.002)


def _ray() -> None:
  address = os.environ.get("JAXPOD_BENCH_RAY")
  if address:
    import ray
    ray.init(address=address, log_to_driver=False)


def trainer(cfg_json: str, size: int, sync: str, rounds: int) -> None:
  """Publish weight ids 1..rounds, each when its round file appears; every host runs this."""
  multi = bool(os.environ.get("JAXPOD_PROCESS_ID"))
  if multi:
    from jaxpod import runtime
    runtime.init()
  import jax
  import jax.numpy as jnp
  import numpy as np

  from jaxpod import transfer
  _ray()
  cfg = transfer.TransferConfig(**json.loads(cfg_json))
  mesh = jax.sharding.Mesh(np.array(jax.devices()), ("x",))
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x", None))  # rows over hosts
  params = {f"layer{i}": jax.jit(lambda i=i, s=s: jnp.full(s, float(i), jnp.float32), out_shardings=sharding)()
            for i, s in enumerate(shapes(size))}
  params = jax.block_until_ready(params)
  host = jax.process_index()
  with transfer.create_server(cfg) as server:
    for r in range(1, rounds + 1):
      wait_file(os.path.join(sync, f"round_{r}"), 600)
      m = server.publish(r, params)
      write_json(os.path.join(sync, f"published_{r}_{host}.json"), m.as_dict())
    wait_file(os.path.join(sync, "stop"), 600)
  if multi:
    from jaxpod import runtime
    runtime.shutdown()
  os._exit(0)


def client(cfg_json: str, size: int, sync: str, rounds: int, index: int) -> None:
  """Receive weight ids 1..rounds (whole model, one device) and report each."""
  import jax
  import numpy as np

  from jaxpod import transfer
  _ray()
  cfg = transfer.TransferConfig(**json.loads(cfg_json))
  one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  like = {f"layer{i}": jax.ShapeDtypeStruct(s, np.float32, sharding=one) for i, s in enumerate(shapes(size))}
  with transfer.create_client(cfg) as c:
    write_json(os.path.join(sync, f"ready_{index}"), {})
    r = 1
    while r <= rounds:
      update = c.receive(like, wait=cfg.receive_timeout_s)
      end = time.time()
      if update is None:
        raise RuntimeError(f"bench client {index}: round {r} not received: {c.metrics()}")
      if update.weight_id < r:
        continue
      write_json(os.path.join(sync, f"client_{index}_{update.weight_id}.json"),
                 {**update.metrics.as_dict(), "end": end})
      r = update.weight_id + 1
      del update
  os._exit(0)


def main(argv: list[str]) -> None:
  role, cfg_json, size, sync, rounds = argv[:5]
  if role == "trainer":
    trainer(cfg_json, int(size), sync, int(rounds))
  else:
    client(cfg_json, int(size), sync, int(rounds), int(argv[5]))


if __name__ == "__main__":
  main(sys.argv[1:])
