"""A 2-host inference client (run by `jaxpod launch`): a (2, 2) mesh over its own 2 hosts x 2
devices, fed by the 2-host trainer of reshard_trainer.py through the real transport.

argv: configs_json sync_dir. Per mode, every host prints
`GOT mode weight_id digest_ok shardings_ok fetched_bytes needed_bytes total_bytes` per update
(digest: sha256 of every addressable shard against the sent arrays' same slice) and
`NONE mode failed_count` when a receive yields nothing.
"""
from __future__ import annotations

import hashlib
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
from jaxpod.transfer import flatten  # noqa: E402

WAIT_S = 60.0


def like():
  host = common.make_params(0)
  return jax.tree_util.tree_map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                host, common.shardings(jax, "client", host))


def needed_bytes(tree) -> int:
  """Bytes of the elements this host's devices hold, counted with a mask (not the transport's code)."""
  total = 0
  for _, leaf in flatten.leaf_names(tree):
    mask = np.zeros(leaf.shape, bool)
    for idx in leaf.sharding.addressable_devices_indices_map(leaf.shape).values():
      mask[idx] = True
    total += int(mask.sum()) * np.dtype(leaf.dtype).itemsize
  return total


def sha(a) -> str:
  a = np.ascontiguousarray(np.asarray(a))
  return hashlib.sha256(a.tobytes()).hexdigest()


def report(mode: str, update, seed: int, want: dict, failed: int = 0) -> None:
  if update is None:
    print(f"NONE {mode} {failed}", flush=True)
    return
  sent = dict(flatten.leaf_names(common.make_params(seed)))
  ok, shard_ok = True, True
  for name, arr in flatten.leaf_names(update.params):
    shard_ok &= arr.sharding == want[name].sharding and arr.dtype == want[name].dtype
    for shard in arr.addressable_shards:
      ok &= sha(shard.data) == sha(sent[name][shard.index])
  total = sum(a.nbytes for a in sent.values())
  print(f"GOT {mode} {update.weight_id} {ok} {shard_ok} {update.metrics.nbytes} {needed_bytes(like())} {total}",
        flush=True)


def main() -> None:
  configs, sync = json.loads(sys.argv[1]), sys.argv[2]
  leader = jax.process_index() == 0
  for raw in configs:
    cfg, mode = transfer.TransferConfig(**raw), raw["mode"]
    want = dict(flatten.leaf_names(like()))
    with transfer.create_client(cfg) as client:
      common.wait_for(sync, mode, "pub7")
      report(mode, client.receive(like(), wait=WAIT_S), 7, want)
      if leader:
        common.signal(sync, mode, "got7")
      common.wait_for(sync, mode, "dead8")
      update = client.receive(like())  # id 8's servers are gone (checkpoint files survive them)
      report(mode, update, 8, want, client.metrics()["failed"])
      if leader:
        common.signal(sync, mode, "after8")
      common.wait_for(sync, mode, "pub5")
      report(mode, client.receive(like(), wait=WAIT_S), 1005, want)  # older id, newer publication
      if leader:
        common.signal(sync, mode, "got5")
      print(f"{'NONE' if client.receive(like()) is None else 'UNEXPECTED'} {mode} end", flush=True)
    runtime.barrier(f"reshard_client/done/{mode}", timeout_s=60)
  runtime.shutdown()


if __name__ == "__main__":
  main()
