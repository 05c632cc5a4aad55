"""A worker process the conformance suite drives over stdin/stdout (JSON lines).

It holds at most one weight server (trainer role) and one weight client (inference role),
created from a TransferConfig sent by the test, and talks to the other processes only through
the real transport. Replies go to the original stdout; everything else (logs, Ray, XLA) to stderr.
Env: JAXPOD_TEST_RAY (Ray GCS address to join, optional). XLA_FLAGS gives 4 CPU devices.
"""
from __future__ import annotations

import json
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
REPLY = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
sys.stdout = sys.stderr

import transfer_common as common  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402

from jaxpod import transfer  # noqa: E402
from jaxpod.transfer import flatten  # noqa: E402

STATE: dict = {}


def send(obj: dict) -> None:
  REPLY.write("@@" + json.dumps(obj) + "\n")
  REPLY.flush()


def trainer_params(seed: int):
  host = common.make_params(seed)
  return jax.tree_util.tree_map(jax.device_put, host, common.shardings(jax, "trainer", host))


def client_like():
  host = common.make_params(0)
  return jax.tree_util.tree_map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                host, common.shardings(jax, "client", host))


def die_mid_pull(mode: str) -> None:
  """Make this process exit (code 17) in the middle of its next pull."""
  def boom(*_a, **_k):
    os._exit(17)
  if mode == "arrow_flight":
    from jaxpod.transfer import flight
    orig = flight.Client._get

    def get_then_die(self, *a, **k):
      orig(self, *a, **k)  # one stream done, others still open
      os._exit(17)
    flight.Client._get = get_then_die
  elif mode == "jax_transfer":
    from jaxpod.transfer import jax_transfer
    jax_transfer.Client._pull = boom  # after the trainer registered the pull, before pulling
  else:
    flatten.Assembler.mark = boom  # after the first block's bytes arrived


def handle(req: dict) -> dict:
  op = req["op"]
  if op == "server":
    if "server" in STATE:
      STATE.pop("server").close()
    STATE["server"] = transfer.create_server(transfer.TransferConfig(**req["config"]))
    return {"ok": True}
  if op == "client":
    if "client" in STATE:
      STATE.pop("client").close()
    STATE["client"] = transfer.create_client(transfer.TransferConfig(**req["config"]))
    return {"ok": True}
  if op == "publish":
    m = STATE["server"].publish(req["weight_id"], trainer_params(req["seed"]))
    return {"ok": True, "metrics": m.as_dict()}
  if op == "receive":
    like = client_like()
    update = STATE["client"].receive(like, wait=req.get("wait"))
    if update is None:
      return {"update": None, "metrics": STATE["client"].metrics()}
    got, want = flatten.leaf_names(update.params), flatten.leaf_names(like)
    shardings_ok = all(g.sharding == w.sharding and g.dtype == w.dtype for (_, g), (_, w) in zip(got, want))
    host = jax.tree_util.tree_map(np.asarray, update.params)
    return {"update": {"weight_id": update.weight_id, "seq": update.seq, "digest": common.digest(host),
                       "shardings_ok": shardings_ok, "metrics": update.metrics.as_dict()}}
  if op == "die_mid_pull":
    die_mid_pull(req["mode"])
    STATE["client"].receive(client_like(), wait=req.get("wait"))
    return {"error": "receive finished without the injected death"}
  if op == "die_mid_serve":  # arrow_flight trainer: exit (code 18) after the first batch of the next stream
    from jaxpod.transfer import flight
    orig = flight._FlightServer.batches

    def batches_then_die(self, *args):
      yield next(orig(self, *args))
      os._exit(18)
    flight._FlightServer.batches = batches_then_die
    return {"ok": True}
  if op == "stall_mid_pull":  # arrow_flight: read one chunk of each stream, then stop reading
    import time

    import pyarrow.flight as fl

    from jaxpod.transfer import flight

    def stalled(self, address, ticket, dst, deadline):
      reader = self._conn(address).do_get(fl.Ticket(json.dumps(ticket).encode()))
      reader.read_chunk()
      open(req["marker"], "a").close()
      time.sleep(req["stall_s"])
    flight.Client._stream = stalled
    update = STATE["client"].receive(client_like())
    return {"update": None if update is None else update.weight_id, "metrics": STATE["client"].metrics()}
  if op == "pull_unregistered":  # jax_transfer: a pull nobody registered must end at our deadline
    import time

    from jaxpod.transfer import api, jax_transfer
    client = jax_transfer.Client(transfer.TransferConfig(**req["config"]))
    server = jax_transfer._start("127.0.0.1")
    spec = jax.ShapeDtypeStruct((16,), np.uint8, sharding=jax.sharding.SingleDeviceSharding(client.device))
    t0 = time.monotonic()
    try:
      client._pull(server.address(), 12345, [spec], deadline=t0 + req["deadline_s"])
    except api.TransferError as e:
      return {"raised": str(e), "waited_s": time.monotonic() - t0}
    return {"error": "an unregistered pull returned"}
  if op == "close":
    for key in ("server", "client"):
      if key in STATE:
        STATE.pop(key).close()
    return {"ok": True}
  raise ValueError(f"unknown op {op!r}")


def main() -> None:
  address = os.environ.get("JAXPOD_TEST_RAY")
  if address:
    import ray
    ray.init(address=address, namespace="jaxpod_test_agents", log_to_driver=False)
  send({"ready": True, "pid": os.getpid(), "devices": jax.device_count()})
  for line in sys.stdin:
    if not line.strip():
      continue
    req = json.loads(line)
    if req["op"] == "exit":
      break
    try:
      send(handle(req))
    except Exception as e:
      send({"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()})
  for key in ("server", "client"):
    if key in STATE:
      STATE.pop(key).close()
  send({"bye": True})
  os._exit(0)  # skip slow interpreter teardown (Ray, XLA threads)


if __name__ == "__main__":
  main()
