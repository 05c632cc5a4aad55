"""A 2-host trainer (run by `jaxpod launch`) for the 2-host -> 2-host resharding test.

argv: configs_json sync_dir. For each config in turn (one per mode), every host calls publish
(each serves only its own shards) and host 0 drops `<mode>.<event>` files in sync_dir for the
client job: pub7 (weight id 7), dead8 (id 8 published, then the servers stop: a trainer gone
mid-serve), pub5 (a restarted trainer restored to step 5 publishes id 5, seed 1005).
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from jaxpod import runtime  # noqa: E402

runtime.init()

import jax  # noqa: E402
import transfer_common as common  # noqa: E402

from jaxpod import transfer  # noqa: E402


def params(seed: int):
  host = common.make_params(seed)
  return jax.tree_util.tree_map(lambda a, s: jax.make_array_from_callback(a.shape, s, lambda i: a[i]),
                                host, common.shardings(jax, "trainer", host))


def signal(sync: str, mode: str, event: str) -> None:
  if jax.process_index() == 0:  # one host signals (every host returns from publish once the version is committed)
    common.signal(sync, mode, event)


def main() -> None:
  configs, sync = json.loads(sys.argv[1]), sys.argv[2]
  for raw in configs:
    cfg, mode = transfer.TransferConfig(**raw), raw["mode"]
    server = transfer.create_server(cfg)
    m = server.publish(7, params(7))
    print(f"SERVED {mode} {m.nbytes}", flush=True)
    signal(sync, mode, "pub7")
    common.wait_for(sync, mode, "got7")
    server.publish(8, params(8))
    server.close()
    signal(sync, mode, "dead8")
    common.wait_for(sync, mode, "after8")
    with transfer.create_server(cfg) as server:  # the restarted trainer, restored to step 5
      server.publish(5, params(1005))
      signal(sync, mode, "pub5")
      common.wait_for(sync, mode, "got5")
    runtime.barrier(f"reshard_trainer/done/{mode}", timeout_s=60)
  runtime.shutdown()


if __name__ == "__main__":
  main()
