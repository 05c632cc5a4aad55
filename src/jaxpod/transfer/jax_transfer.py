"""Mode "jax_transfer": `jax.experimental.transfer` pulls, handshaken through the coordinator.

Handshake (no step can hang):
1. The trainer starts a transfer server (on `bind_address`) and commits each version with
   its address. It keeps the last keep_n versions as single-device uint8 arrays.
2. A client picks a random pull id and asks the coordinator for (seq, host): "requested".
3. The trainer's serve thread (polling every `poll_interval_s`) answers: `await_pull(id,
   arrays)` (which returns at once) and marks the request "ready", or "gone" when that
   version is no longer kept. Publish never waits for clients; a request a dead client left
   "ready" is forgotten after `receive_timeout_s`.
4. The client waits for "ready" up to its deadline, then pulls in a helper thread joined
   with the remaining deadline (`pull` returns at once with arrays that are still being
   filled, and for an id the server never registered they never are, whatever the timeout;
   the thread waits for them, is abandoned at the deadline, and the receive returns None),
   then ends the request.
Limitation: arrays registered for a pull that never happens stay referenced by the transfer
server (there is no public unregister); a dead client costs one version's bytes on the trainer.
"""
from __future__ import annotations

import random
import threading
import time

import jax
import numpy as np
from jax.experimental import transfer

from jaxpod.transfer import api, flatten
from jaxpod.transfer.metrics import TransferMetrics


def _start(bind_address: str):
  return transfer.start_transfer_server(jax.local_devices()[0].client, f"{bind_address}:0", [f"{bind_address}:0"])


class Server(api.ServerBase):
  """Holds kept versions on device 0 and answers pull requests from a background thread."""

  keeps_pieces = True

  def __init__(self, config, coordinator=None):
    super().__init__(config, coordinator)
    self.device = jax.local_devices()[0]
    self.ts = _start(config.bind_address)
    self.versions: dict[int, list[jax.Array]] = {}
    self.stop = threading.Event()
    self.thread = threading.Thread(target=self._serve_loop, name="jax-transfer-serve", daemon=True)
    self.thread.start()

  def _stage(self, seq: int, table: dict, pieces: list[flatten.Piece], m: TransferMetrics) -> dict:
    with m.phase("device_put"):
      arrays = [jax.device_put(p.data.reshape(-1).view(np.uint8), self.device) for p in pieces]
      self.versions[seq] = jax.block_until_ready(arrays)
    port = self.ts.address().rsplit(":", 1)[1]
    return {"address": f"{self.config.dial_host()}:{port}"}

  def _retire(self, seqs: list[int]) -> None:
    for seq in seqs:
      self.versions.pop(seq, None)

  def _serve_loop(self) -> None:
    host = jax.process_index()
    while not self.stop.wait(self.config.poll_interval_s):
      try:
        self._serve_once(host)
      except Exception as e:  # a coordinator hiccup must not kill the serve thread
        api.log.warning("jax_transfer serve loop: %r", e)

  def _serve_once(self, host: int) -> None:
    now = time.time()
    for pull_id, req in self.coord.pulls():
      if req.get("host", 0) != host:
        continue
      if req["state"] == "requested":
        arrays = self.versions.get(req["seq"])
        if arrays is None:
          self.coord.set_pull_state(pull_id, req, "gone")
        else:
          self.ts.await_pull(pull_id, arrays)
          self.coord.set_pull_state(pull_id, req, "ready")
      elif now - req["time"] > self.config.receive_timeout_s:
        self.coord.end_pull(pull_id)  # its client died or gave up

  def _close(self) -> None:
    self.stop.set()
    self.thread.join(timeout=5 * self.config.poll_interval_s + self.config.coordinator_timeout_s)
    self.versions.clear()


class Client(api.ClientBase):
  """Requests a pull per trainer host, waits for the trainer's answer, pulls under a deadline.

  A pull moves every array the trainer host registered for it: a multi-host client gets whole
  versions (and keeps only its slices)."""

  granularity = "all"

  def __init__(self, config, coordinator=None):
    super().__init__(config, coordinator)
    self.device = jax.local_devices()[0]
    self.ts = _start(config.bind_address)
    self.conns: dict[str, object] = {}

  def _await_ready(self, pull_id: int, seq: int, deadline: float) -> None:
    while True:
      state = self.coord.pull_state(pull_id)
      if state is not None and state["state"] == "ready":
        return
      if state is not None and state["state"] == "gone":
        raise api.TransferError(f"version seq={seq} is no longer served by the trainer")
      if time.monotonic() > deadline:
        raise api.TransferError(f"trainer did not answer pull request for seq={seq} before the deadline "
                                "(is the trainer process alive?)")
      time.sleep(self.config.poll_interval_s)

  def _pull(self, address: str, pull_id: int, specs: list, deadline: float) -> list:
    result: dict = {}

    def run():
      try:
        conn = self.conns.get(address) or self.conns.setdefault(address, self.ts.connect(address))
        # pull returns at once with arrays still being filled: wait for them here, in the guarded thread
        result["arrays"] = jax.block_until_ready(conn.pull(pull_id, specs))
      except Exception as e:
        result["error"] = e
    t = threading.Thread(target=run, name=f"jax-transfer-pull-{pull_id}", daemon=True)
    t.start()
    t.join(timeout=max(0.0, deadline - time.monotonic()))
    if t.is_alive():
      self.conns.pop(address, None)
      raise api.TransferError(f"pull {pull_id} from {address} passed its deadline (abandoned)")
    if "error" in result:
      self.conns.pop(address, None)
      raise api.TransferError(f"pull {pull_id} from {address} failed: {result['error']!r}")
    return result["arrays"]

  def _fetch(self, record: dict, asm: flatten.Assembler, m: TransferMetrics, deadline: float) -> None:
    sharding = jax.sharding.SingleDeviceSharding(self.device)
    for part in record["meta"]["parts"]:
      pull_id = random.getrandbits(62)
      try:
        with m.phase("handshake"):
          self.coord.request_pull(record["seq"], pull_id, part["host"])
          self._await_ready(pull_id, record["seq"], deadline)
        specs = [jax.ShapeDtypeStruct((p["nbytes"],), np.uint8, sharding=sharding) for p in part["pieces"]]
        with m.phase("fetch"):
          arrays = self._pull(part["address"], pull_id, specs, deadline)
      finally:
        self.coord.end_pull(pull_id)
      with m.phase("decode"):
        for meta, arr in zip(part["pieces"], arrays):
          asm.put_bytes(meta, np.asarray(arr))
