"""The weight-transfer contract, run against every mode with trainer and clients in separate
OS processes that talk only through the real transport (and a real local Ray cluster).

Every received version is checked leaf by leaf (sha256 of dtype, shape, bytes) against the
published one: fp32, bf16 and int32 leaves, a nested pytree, and one parameter larger than a
Flight chunk. The trainer places params on a (4,) mesh and clients ask for a (2, 2) mesh with
other partition specs, so every receive also checks resharding onto the client's own layout.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers"))
import transfer_common as common  # noqa: E402

from jaxpod.transfer.config import MODES  # noqa: E402

WAIT_S = 20.0


def config(mode: str, tmp_path, namespace: str, **overrides) -> dict:
  return {"mode": mode, "name": "weights", "ray_namespace": namespace, "folder": str(tmp_path / "weights"),
          "keep_n": 3, "chunk_bytes": common.CHUNK_BYTES, "stream_bytes": common.STREAM_BYTES,
          "receive_timeout_s": 8.0, "publish_timeout_s": 20.0, "coordinator_timeout_s": 10.0,
          "poll_interval_s": 0.02, **overrides}


def expect(reply: dict, weight_id: int, seed: int) -> None:
  update = reply["update"]
  assert update is not None, f"expected weight_id={weight_id}, got None"
  assert update["weight_id"] == weight_id
  assert update["shardings_ok"], "received arrays are not on the client's own shardings"
  assert update["digest"] == common.digest(common.make_params(seed))


@pytest.fixture(params=MODES)
def mode(request):
  return request.param


def test_versions_arrive_in_order_then_none(mode, fresh, tmp_path, ray_namespace):
  """Contract: None before the first publish; each newer version once, in order; then None."""
  trainer, client, _ = fresh
  cfg = config(mode, tmp_path, ray_namespace)
  trainer.call("server", config=cfg)
  client.call("client", config=cfg)
  assert client.call("receive")["update"] is None
  for k in (1, 2, 3):
    trainer.call("publish", weight_id=k, seed=k)
    expect(client.call("receive", wait=WAIT_S), k, k)
  assert client.call("receive")["update"] is None


def test_checkpoint_mode_through_a_bucket(fresh, bucket, tmp_path):
  """Invariant 8: the checkpoint transport and its filesystem coordinator on gs:// (the test GCS server):
  versions arrive in order with every array's sha256 intact."""
  trainer, client, _ = fresh
  cfg = dict(config("checkpoint", tmp_path, "unused"), folder=f"{bucket}/weights")
  trainer.call("server", config=cfg)
  client.call("client", config=cfg)
  for k in (1, 2):
    trainer.call("publish", weight_id=k, seed=k)
    expect(client.call("receive", wait=WAIT_S), k, k)
  assert client.call("receive")["update"] is None


def test_two_clients_and_a_late_joiner(mode, fresh, tmp_path, ray_namespace):
  """Two clients on one coordinator both get each version; a client created later gets the newest."""
  trainer, c1, c2 = fresh
  cfg = config(mode, tmp_path, ray_namespace)
  trainer.call("server", config=cfg)
  c1.call("client", config=cfg)
  c2.call("client", config=cfg)
  trainer.call("publish", weight_id=10, seed=10)
  expect(c1.call("receive", wait=WAIT_S), 10, 10)
  expect(c2.call("receive", wait=WAIT_S), 10, 10)
  trainer.call("publish", weight_id=20, seed=20)
  trainer.call("publish", weight_id=30, seed=30)
  expect(c1.call("receive", wait=WAIT_S), 30, 30)  # skips 20: newest wins
  c2.call("client", config=cfg)  # a new worker joins late
  expect(c2.call("receive", wait=WAIT_S), 30, 30)
  assert c2.call("receive")["update"] is None


def test_older_id_rolls_clients_back(mode, fresh, tmp_path, ray_namespace):
  """Older-id rule: a trainer restored to an older step publishes a lower id; clients take it."""
  trainer, client, _ = fresh
  cfg = config(mode, tmp_path, ray_namespace)
  trainer.call("server", config=cfg)
  client.call("client", config=cfg)
  trainer.call("publish", weight_id=50, seed=50)
  expect(client.call("receive", wait=WAIT_S), 50, 50)
  trainer.call("server", config=cfg)  # the trainer restarts from its step-40 checkpoint
  trainer.call("publish", weight_id=40, seed=1040)
  expect(client.call("receive", wait=WAIT_S), 40, 1040)
  assert client.call("receive")["update"] is None


def test_bf16_on_the_wire(mode, fresh, tmp_path, ray_namespace):
  """wire_dtype="bfloat16": floating leaves travel as bf16 and arrive in the client's dtype
  (fp32 leaves equal to their bf16 rounding); integer leaves are untouched."""
  import ml_dtypes
  import numpy as np
  trainer, client, _ = fresh
  cfg = config(mode, tmp_path, ray_namespace, wire_dtype="bfloat16")
  trainer.call("server", config=cfg)
  client.call("client", config=cfg)
  metrics = trainer.call("publish", weight_id=1, seed=1)["metrics"]
  rounded = common.make_params(1)
  rounded["embed"]["w"] = rounded["embed"]["w"].astype(ml_dtypes.bfloat16).astype(np.float32)
  rounded["big"] = rounded["big"].astype(ml_dtypes.bfloat16).astype(np.float32)
  for layer in rounded["layers"]:
    layer["b"] = layer["b"].astype(ml_dtypes.bfloat16).astype(np.float32)
  update = client.call("receive", wait=WAIT_S)["update"]
  assert update["shardings_ok"] and update["digest"] == common.digest(rounded)
  wire = sum(a.nbytes // 2 if a.dtype == np.float32 else a.nbytes for a in common.leaves(common.make_params(1)))
  assert metrics["bytes"] == wire


def test_trainer_killed_and_restarted(mode, pool, fresh, tmp_path, ray_namespace):
  """Fail loudly, never hang: clients outlive a killed trainer and pick up its successor's weights.
  arrow_flight: the trainer dies mid-serve (after the first batch of a stream the client asked for)."""
  restarted, client, _ = fresh
  cfg = config(mode, tmp_path, ray_namespace, receive_timeout_s=2.0)
  doomed = pool.take()
  doomed.call("server", config=cfg)
  client.call("client", config=cfg)
  doomed.call("publish", weight_id=1, seed=1)
  expect(client.call("receive", wait=WAIT_S), 1, 1)
  doomed.call("publish", weight_id=2, seed=2)
  if mode == "arrow_flight":
    doomed.call("die_mid_serve")
  else:
    doomed.kill()
  reply = client.call("receive")  # version 2's server died with it: a failed receive, not a hang
  if mode == "arrow_flight":
    assert doomed.proc.wait(timeout=60) == 18, doomed.tail()  # it did die inside do_get
  if mode == "checkpoint" or (mode == "ray" and reply["update"] is not None):
    expect(reply, 2, 2)  # files survive; Ray may still hold a copy of the dead owner's objects
  else:
    assert reply["update"] is None and reply["metrics"]["failed"] == 1, reply
  restarted.call("server", config=cfg)
  restarted.call("publish", weight_id=2, seed=2002)
  expect(client.call("receive", wait=WAIT_S), 2, 2002)


def test_client_killed_mid_pull(mode, pool, fresh, tmp_path, ray_namespace):
  """A client dying mid-pull does not block the trainer past its deadline; others still receive."""
  trainer, client, _ = fresh
  cfg = config(mode, tmp_path, ray_namespace)
  trainer.call("server", config=cfg)
  trainer.call("publish", weight_id=1, seed=1)
  victim = pool.take()
  victim.call("client", config=cfg)
  victim.send("die_mid_pull", mode=mode, wait=WAIT_S)
  assert victim.proc.wait(timeout=60) == 17, victim.tail()
  trainer.call("publish", weight_id=2, seed=2, timeout_s=cfg["publish_timeout_s"] + 10)
  client.call("client", config=cfg)
  expect(client.call("receive", wait=WAIT_S), 2, 2)


def test_stalled_client_blocks_nobody(pool, fresh, tmp_path, ray_namespace):
  """Fan-out, arrow_flight: a client that stops reading mid-stream does not hold up the trainer
  (which keeps publishing and retires that version) or another client; its own receive ends at
  its deadline with None."""
  trainer, client, _ = fresh
  cfg = config("arrow_flight", tmp_path, ray_namespace, keep_n=1, receive_timeout_s=3.0)
  trainer.call("server", config=cfg)
  trainer.call("publish", weight_id=1, seed=1)
  slow, marker = pool.take(), tmp_path / "stalled"
  try:
    slow.call("client", config=cfg)
    slow.send("stall_mid_pull", marker=str(marker), stall_s=120)
    deadline = time.monotonic() + 60
    while not marker.exists():
      assert time.monotonic() < deadline and slow.proc.poll() is None, slow.tail()
      time.sleep(0.02)
    for k in (2, 3):
      trainer.call("publish", weight_id=k, seed=k)
    client.call("client", config=cfg)
    expect(client.call("receive", wait=WAIT_S), 3, 3)
    reply = slow._reply("stall_mid_pull", timeout_s=60)  # its deadline (3 s), far before the 120 s stall
    assert reply["update"] is None and reply["metrics"]["failed"] == 1, reply
  finally:
    slow.kill()


@pytest.mark.parametrize("mode", [m for m in MODES if m != "checkpoint"])  # checkpoint: no actor
def test_coordinator_actor_restart(mode, fresh, tmp_path, ray_namespace):
  """The Ray coordinator actor dies and Ray restarts it empty (a new epoch, seq from 1 again):
  clients holding a higher seq from the old epoch still take the next publication."""
  import ray
  trainer, client, _ = fresh
  cfg = config(mode, tmp_path, ray_namespace)
  trainer.call("server", config=cfg)
  client.call("client", config=cfg)
  for k in (1, 2):
    trainer.call("publish", weight_id=k, seed=k)
  expect(client.call("receive", wait=WAIT_S), 2, 2)
  ray.kill(ray.get_actor("weights", namespace=ray_namespace), no_restart=False)
  trainer.call("publish", weight_id=3, seed=3)
  expect(client.call("receive", wait=WAIT_S), 3, 3)


def test_ray_cluster_and_its_joiners_listen_on_loopback_only(agents):
  """Security: the Ray cluster jaxpod starts (`ray_local.local_cluster`, here the tests' own) reports
  127.0.0.1 for its GCS and node, and no process of this test session (GCS server, raylet, Ray
  workers and agents, the processes that joined it, the transports' servers) listens on any
  address but loopback."""
  import psutil

  from jaxpod.transfer import ray_local, secrets
  assert all(secrets.is_loopback(host) for host in ray_local.addresses()), ray_local.addresses()
  listening, names = [], set()
  for proc in [psutil.Process(), *psutil.Process().children(recursive=True)]:
    try:
      found = [c.laddr.ip for c in proc.net_connections("inet") if c.status == psutil.CONN_LISTEN]
      names.add(proc.name())
    except psutil.NoSuchProcess:
      continue
    listening += [(proc.name(), ip) for ip in found]
  assert {"gcs_server", "raylet"} <= names and listening, names  # Ray's own servers were looked at
  assert [(name, ip) for name, ip in listening if not secrets.is_loopback(ip)] == []


def test_jax_transfer_unregistered_pull_ends_at_its_deadline(pool, tmp_path, ray_namespace):
  """jax_transfer: `pull` of an id the server never registered ignores its own timeout (field
  failure); the client's guard turns it into a TransferError at the deadline instead of a hang."""
  agent = pool.take()
  try:
    reply = agent.call("pull_unregistered", config=config("jax_transfer", tmp_path, ray_namespace), deadline_s=1.0)
    assert "passed its deadline" in reply["raised"]
  finally:
    agent.kill()  # its abandoned pull thread would hold the process until the server exits


def test_half_written_checkpoint_never_loaded(fresh, tmp_path):
  """checkpoint mode: a version folder without its marker (trainer died mid-write) is invisible,
  and only the last keep_n version folders remain."""
  trainer, client, _ = fresh
  cfg = config("checkpoint", tmp_path, "unused", keep_n=2)
  trainer.call("server", config=cfg)
  client.call("client", config=cfg)
  for k in (1, 2, 3):
    trainer.call("publish", weight_id=k, seed=k)
  half = tmp_path / "weights" / "v000000099999"
  half.mkdir()
  (half / "host0.safetensors").write_bytes(b"\x00" * 100)  # truncated, and no marker
  expect(client.call("receive", wait=WAIT_S), 3, 3)
  assert client.call("receive")["update"] is None
  kept = sorted(p.name for p in (tmp_path / "weights").iterdir() if p.name.startswith("v"))
  assert kept == ["v000000000002", "v000000000003", "v000000099999"]


@pytest.mark.slow
def test_coordinator_creation_race(ray_address, tmp_path):
  """Many processes racing to create the named coordinator all get the same live actor; a dead
  actor is replaced and re-resolved."""
  import ray

  from jaxpod.transfer import coordinators
  namespace, name, n = f"race_{uuid.uuid4().hex[:8]}", "coord", 6
  go = tmp_path / "go"
  procs = [subprocess.Popen([sys.executable, os.path.join(common.__file__.rsplit("/", 1)[0], "race.py"),
                             ray_address, namespace, name, str(go)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL) for _ in range(n)]
  deadline = time.time() + 90
  while len(list(tmp_path.glob("ready-*"))) < n and time.time() < deadline and all(p.poll() is None for p in procs):
    time.sleep(0.05)
  go.write_text("go")
  outs = [p.communicate(timeout=90)[0].decode() for p in procs]
  assert all(p.returncode == 0 for p in procs), outs
  lines = [line.split() for out in outs for line in out.splitlines() if line.startswith("ACTOR")]
  assert len({actor for _, actor, _ in lines}) == 1, lines
  assert sorted(int(count) for *_, count in lines) == list(range(1, n + 1))
  store = coordinators.RayStore(name, namespace, timeout_s=10)
  assert store.get("callers") == n
  old = store.actor
  ray.kill(old, no_restart=True)
  _wait_dead(old)  # ray.kill is asynchronous: a put could still land on the dying actor
  store.put("after", 1)  # the dead handle is re-resolved to a new actor
  assert store.get("after") == 1 and store.get("callers") is None
  ray.kill(store.actor, no_restart=True)


def _wait_dead(actor, timeout_s: float = 30.0) -> None:
  """Poll a call on `actor` until Ray reports it dead (RayActorError), or fail at the deadline."""
  import ray
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    try:
      ray.get(actor.get.remote("callers"), timeout=5)
    except ray.exceptions.RayActorError:
      return
    except ray.exceptions.GetTimeoutError:
      pass
    time.sleep(0.05)
  raise AssertionError(f"actor still answers {timeout_s}s after ray.kill")


def _params_bytes(seed: int) -> int:
  import numpy as np
  return sum(np.asarray(a).nbytes for a in common.leaves(common.make_params(seed)))



def ray_node_env() -> dict:
  """What a host joining the test's Ray cluster needs: its auth token, which `ray.init` wrote under the
  test's HOME; isolated hosts have their own HOME, so the token is handed to them as a cluster admin
  distributes it to every node (RAY_AUTH_TOKEN_PATH)."""
  from pathlib import Path
  token = Path.home() / ".ray" / "auth_token"
  return {"RAY_AUTH_TOKEN_PATH": str(token)} if token.is_file() else {}


@pytest.mark.slow
def test_multi_host_trainer_sends_each_array_once(launch_hosts, fresh, tmp_path, ray_namespace, ray_address):
  """Invariant 4 (replica 0 only), every mode: each host of a 2-host trainer calls publish;
  together they put each element on the wire once, and a client on another mesh gets the model.
  Invariant 9: on every host, publish returns only once the version is committed (the first mode's
  leader commit is held back until host 1 has read, so a host returning early is always caught),
  and a leader whose commit fails makes publish raise on every host (PeerFailed on host 1), not hang.
  (One launch serves every mode in turn, to start the 2-host job once.)"""
  _, client, _ = fresh
  configs = [config(mode, tmp_path, ray_namespace, name=f"weights_{mode}") for mode in MODES]
  done, box = str(tmp_path / "done_"), []
  script = os.path.join(os.path.dirname(common.__file__), "multihost_trainer.py")
  launcher = threading.Thread(target=lambda: box.append(launch_hosts(
      script, hosts=2, devices_per_host=2, args=[json.dumps(configs), 7, 7, done], timeout_s=240,
      env={"JAXPOD_TEST_RAY": ray_address, **ray_node_env()})))
  launcher.start()
  replies = {}
  try:
    for cfg in configs:
      client.call("client", config=cfg)
      replies[cfg["mode"]] = client.call("receive", wait=90.0, timeout_s=120)
      open(done + cfg["mode"], "w").close()
  finally:
    for mode in MODES:
      open(done + mode, "w").close()
    launcher.join()
    _kill_actors(ray_namespace, [cfg["name"] for cfg in configs])
  result = box[0]
  assert result.returncode == 0, result.all_output[-4000:]
  failed = [line for i in range(2) for line in result.output[i] if line.startswith("COMMIT_FAILED")]
  assert failed == ["COMMIT_FAILED RuntimeError", "COMMIT_FAILED PeerFailed"], failed
  for mode in MODES:
    expect(replies[mode], 7, 7)
    sent = [int(line.split()[2]) for i in range(2) for line in result.output[i] if line.startswith(f"BYTES {mode} ")]
    assert len(sent) == 2 and sum(sent) == _params_bytes(7), (mode, sent)
    committed = [line for i in range(2) for line in result.output[i] if line.startswith(f"COMMITTED {mode} ")]
    assert committed == [f"COMMITTED {mode} True"] * 2, (mode, committed)


def _kill_actors(namespace: str, names: list[str]) -> None:
  import ray
  for name in names:
    try:
      ray.kill(ray.get_actor(name, namespace=namespace), no_restart=True)
    except ValueError:
      pass


IN_JOB_MODES = ("checkpoint", "jax_transfer", "arrow_flight")  # "ray" keeps refs in the Ray actor only


@pytest.mark.slow
def test_in_job_kv_coordinator(launch_hosts, tmp_path):
  """Trainer (host 0) and worker (host 1) in one jax.distributed job, coordinated through the
  JAX key-value store, for every mode that can use it (one launch runs them in turn). Neither host,
  host 0 running the coordination service, listens on any address but loopback."""
  configs = [config(mode, tmp_path, "unused", coordinator="kv", name=f"weights_{mode}",
                    folder=str(tmp_path / mode)) for mode in IN_JOB_MODES]
  script = os.path.join(os.path.dirname(common.__file__), "in_job.py")
  result = launch_hosts(script, hosts=2, devices_per_host=2, args=[json.dumps(configs)], timeout_s=180)
  assert result.returncode == 0, result.all_output[-4000:]
  lines = [line for line in result.output[1] if line.startswith(("GOT", "NONE", "UNEXPECTED"))]
  want = [line for m in IN_JOB_MODES for line in (f"GOT {m} 1 True", f"GOT {m} 2 True", f"NONE {m}")]
  assert lines == want, result.all_output[-4000:]
  listeners = [line for i in range(2) for line in result.output[i] if line.startswith("OFF_HOST_LISTENERS")]
  assert listeners == ["OFF_HOST_LISTENERS []"] * 2, listeners
