"""A 2-host trainer (run by `jaxpod launch`): params on one (4,) mesh spanning both hosts.

argv: configs_json seed weight_id done_prefix. For each config in turn (one per mode), every
host calls publish (the same program) and prints `BYTES mode n`, the bytes it put on the wire,
then keeps serving until `<done_prefix><mode>` exists.
"""
from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from jaxpod import runtime  # noqa: E402

runtime.init()

import jax  # noqa: E402
import transfer_common as common  # noqa: E402

from jaxpod import transfer  # noqa: E402


def main() -> None:
  configs, seed, weight_id, done = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
  if os.environ.get("JAXPOD_TEST_RAY"):
    import ray
    ray.init(address=os.environ["JAXPOD_TEST_RAY"], namespace="jaxpod_test_agents", log_to_driver=False)
  host = common.make_params(seed)
  params = jax.tree_util.tree_map(lambda a, s: jax.make_array_from_callback(a.shape, s, lambda i: a[i]),
                                  host, common.shardings(jax, "trainer", host))
  for cfg in configs:
    with transfer.create_server(transfer.TransferConfig(**cfg)) as server:
      m = server.publish(weight_id, params)
      print(f"BYTES {cfg['mode']} {m.nbytes}", flush=True)
      deadline = time.time() + 120
      while not os.path.exists(done + cfg["mode"]) and time.time() < deadline:
        time.sleep(0.05)
      runtime.barrier(f"multihost_trainer/done/{cfg['mode']}", timeout_s=60)
  runtime.shutdown()


if __name__ == "__main__":
  main()
