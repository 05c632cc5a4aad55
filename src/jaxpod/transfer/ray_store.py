"""Mode "ray": pieces in the Ray object store, their refs registered with the coordinator actor.

Each piece is stored as a raw uint8 numpy array (dtype and shape travel in the version
record as JSON). The trainer process owns the objects (Ray 2.56 removed `ray.put(_owner=)`),
so a version dies with its trainer: clients then get `TransferError` -> None until the
restarted trainer publishes again. The actor holds the refs of the last keep_n versions;
dropping a record frees its objects.
Ray serialises the refs and arrays with its own pickle-based format: the one place jaxpod
accepts pickle from the network, because Ray imposes it; only numpy arrays and refs are stored.
"""
from __future__ import annotations

import numpy as np

from jaxpod.transfer import api, coordinators, flatten
from jaxpod.transfer.metrics import TransferMetrics


class Server(api.ServerBase):
  """`ray.put` each piece, register the refs with the coordinator actor."""

  def __init__(self, config, coordinator=None):
    super().__init__(config, coordinator)
    if not isinstance(self.coord.store, coordinators.RayStore):
      raise ValueError("mode='ray' needs coordinator='ray' (refs live in the actor)")

  def _stage(self, seq: int, table: dict, pieces: list[flatten.Piece], m: TransferMetrics) -> dict:
    import ray
    with m.phase("store"):
      refs = [ray.put(p.data.reshape(-1).view(np.uint8)) for p in pieces]
    return {"refs": refs}


class Client(api.ClientBase):
  """`ray.get` the refs of the newest version (zero-copy reads from shared memory).

  An object is all or nothing: a multi-host client gets every piece that overlaps its slices."""

  granularity = "piece"

  def _fetch(self, record: dict, asm: flatten.Assembler, m: TransferMetrics, deadline: float) -> None:
    import time

    import ray
    for part in record["meta"]["parts"]:
      wanted = [(meta, ref) for meta, ref in zip(part["pieces"], part["refs"]) if asm.blocks(meta)]
      if not wanted:
        continue
      try:
        with m.phase("fetch"):
          arrays = ray.get([ref for _, ref in wanted], timeout=max(0.1, deadline - time.monotonic()))
      except (ray.exceptions.ObjectLostError, ray.exceptions.GetTimeoutError,
              ray.exceptions.RayActorError) as e:
        raise api.TransferError(f"version seq={record['seq']} unavailable: {type(e).__name__}: {e}") from None
      with m.phase("decode"):
        for (meta, _), raw in zip(wanted, arrays):
          asm.put_bytes(meta, raw)
