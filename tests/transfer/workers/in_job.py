"""One jax.distributed job of 2 hosts with the in-job coordinator (coordinator="kv"):
host 0 is the trainer, host 1 the inference worker (params reshard onto its own mesh).

argv: configs_json (one per mode, run in turn). Host 1 prints `GOT mode weight_id ok` per
received version and `NONE mode` when nothing newer is left. At the end every host prints
`OFF_HOST_LISTENERS [...]`: the addresses it listens on other than loopback (none expected).
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from jaxpod import runtime  # noqa: E402

runtime.init()

import jax  # noqa: E402
import numpy as np  # noqa: E402
import transfer_common as common  # noqa: E402

from jaxpod import transfer  # noqa: E402


def local_shardings(role: str, tree):
  """Shardings over this host's own 2 devices: trainer (2,) "x", worker (1, 2) "a","b"."""
  auto = jax.sharding.AxisType.Auto
  devices = jax.local_devices()
  if role == "trainer":
    mesh = jax.sharding.Mesh(np.array(devices).reshape(2), ("x",), axis_types=(auto,))
  else:
    mesh = jax.sharding.Mesh(np.array(devices).reshape(1, 2), ("a", "b"), axis_types=(auto, auto))
  P = jax.sharding.PartitionSpec
  return jax.tree_util.tree_map(lambda _, s: jax.sharding.NamedSharding(mesh, P(*s)), tree, common.specs(role))


def run(cfg) -> None:
  host = common.make_params(0)
  if jax.process_index() == 0:
    with transfer.create_server(cfg) as server:
      for k in (1, 2):
        params = jax.tree_util.tree_map(jax.device_put, common.make_params(k), local_shardings("trainer", host))
        server.publish(k, params)
        runtime.barrier(f"in_job/{cfg.mode}/published/{k}", timeout_s=60)
        runtime.barrier(f"in_job/{cfg.mode}/received/{k}", timeout_s=60)
  else:
    like = jax.tree_util.tree_map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                  host, local_shardings("worker", host))
    with transfer.create_client(cfg) as client:
      for k in (1, 2):
        runtime.barrier(f"in_job/{cfg.mode}/published/{k}", timeout_s=60)
        update = client.receive(like, wait=30)
        got = jax.tree_util.tree_map(np.asarray, update.params)
        ok = common.digest(got) == common.digest(common.make_params(k))
        print(f"GOT {cfg.mode} {update.weight_id} {ok}", flush=True)
        runtime.barrier(f"in_job/{cfg.mode}/received/{k}", timeout_s=60)
      print(f"{'NONE' if client.receive(like) is None else 'UNEXPECTED'} {cfg.mode}", flush=True)


def off_host_listeners() -> list[str]:
  """Addresses this process listens on other than loopback (host 0 runs the coordination service)."""
  import psutil

  from jaxpod.transfer.secrets import is_loopback
  return [f"{c.laddr.ip}:{c.laddr.port}" for c in psutil.Process().net_connections("inet")
          if c.status == psutil.CONN_LISTEN and not is_loopback(c.laddr.ip)]


def main() -> None:
  for cfg in json.loads(sys.argv[1]):
    run(transfer.TransferConfig(**cfg))
  print(f"OFF_HOST_LISTENERS {off_host_listeners()}", flush=True)
  runtime.shutdown()


if __name__ == "__main__":
  main()
