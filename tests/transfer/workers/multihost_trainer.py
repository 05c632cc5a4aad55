"""A 2-host trainer (run by `jaxpod launch`): params on one (4,) mesh spanning both hosts.

argv: configs_json seed weight_id done_prefix. For each config in turn (one per mode), every
host calls publish (the same program) and prints `BYTES mode n`, the bytes it put on the wire,
and `COMMITTED mode ok`: whether the coordinator's latest record, read right after this host's
publish returned, is this publication (invariant 9). For the first config the leader's commit is
held back until host 1 has read (or HOLD_S passes), so a host that returns before the commit is
caught every time. Then every host keeps serving until `<done_prefix><mode>` exists. Last, one
publish whose leader commit fails: every host prints `COMMIT_FAILED <exception type>` (the
leader its own error, host 1 PeerFailed), none waits for a commit that never comes.
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
from jaxpod.runtime import kv  # noqa: E402
from jaxpod.transfer import coordinators  # noqa: E402

HOLD_S = 2.0


class CommitHeldUntilHost1Reads(coordinators.Coordinator):
  """Test-only delay around a real coordinator: the leader's commit waits until host 1 has read the
  latest record after its own publish returned (or HOLD_S passes). A trainer host that returns from
  publish before the commit then reads an older record, deterministically; with invariant 9 kept,
  host 1 cannot read before the commit, and the hold just ends at HOLD_S."""

  def __init__(self, base: coordinators.Coordinator, key: str):
    super().__init__(base.store, base.keep_n)
    self.key = key

  def commit(self, *args, **kwargs):
    deadline = time.monotonic() + HOLD_S
    while kv.try_get(self.key) is None and time.monotonic() < deadline:
      time.sleep(0.02)
    return super().commit(*args, **kwargs)


class CommitRefused(coordinators.Coordinator):
  """Test-only: a real coordinator whose commit raises (a coordinator that fails at the worst moment)."""

  def commit(self, *args, **kwargs):
    raise RuntimeError("test: the coordinator refused the commit")


def main() -> None:
  configs, seed, weight_id, done = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
  if os.environ.get("JAXPOD_TEST_RAY"):
    import ray
    ray.init(address=os.environ["JAXPOD_TEST_RAY"], namespace="jaxpod_test_agents", log_to_driver=False)
  host = common.make_params(seed)
  params = jax.tree_util.tree_map(lambda a, s: jax.make_array_from_callback(a.shape, s, lambda i: a[i]),
                                  host, common.shardings(jax, "trainer", host))
  for i, cfg in enumerate(configs):
    config, read_key = transfer.TransferConfig(**cfg), f"multihost_trainer/read/{cfg['mode']}"
    coord = coordinators.create_coordinator(config)
    with transfer.create_server(config, CommitHeldUntilHost1Reads(coord, read_key) if i == 0 else coord) as server:
      m = server.publish(weight_id, params)
      latest = server.coord.latest()
      print(f"COMMITTED {cfg['mode']} {latest is not None and latest['seq'] == m.seq}", flush=True)
      if jax.process_index() == 1:
        kv.set(read_key, "1")
      print(f"BYTES {cfg['mode']} {m.nbytes}", flush=True)
      deadline = time.time() + 120
      while not os.path.exists(done + cfg["mode"]) and time.time() < deadline:
        time.sleep(0.05)
      runtime.barrier(f"multihost_trainer/done/{cfg['mode']}", timeout_s=60)
  config = transfer.TransferConfig(**configs[-1])
  base = coordinators.create_coordinator(config)
  with transfer.create_server(config, CommitRefused(base.store, base.keep_n)) as server:
    try:
      server.publish(weight_id + 1, params)
      print("COMMIT_FAILED none", flush=True)
    except Exception as e:
      print(f"COMMIT_FAILED {type(e).__name__}", flush=True)
  runtime.shutdown()


if __name__ == "__main__":
  main()
