"""Fixtures for the transfer conformance suite: one real local Ray cluster per module and a
pool of worker processes (tests/transfer/workers/agent.py) driven over stdin/stdout.

Worker processes are real OS processes that talk only through the transport under test.
Spare agents are started in the background so a test that kills one gets a fresh one fast.
"""
from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import uuid

import pytest

WORKERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers")
REPLY_TIMEOUT_S = 90.0


class Agent:
  """One worker process; `call(op, **kw)` sends a request and waits for its JSON reply."""

  def __init__(self, env: dict, log_path: str):
    self.log_path = log_path
    self.log = open(log_path, "wb")
    self.proc = subprocess.Popen([sys.executable, os.path.join(WORKERS, "agent.py")], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=self.log, env=env)
    self.replies: queue.Queue = queue.Queue()
    threading.Thread(target=self._read, daemon=True).start()
    self.ready = None

  def _read(self):
    for raw in self.proc.stdout:
      line = raw.decode(errors="replace")
      if line.startswith("@@"):
        self.replies.put(json.loads(line[2:]))
    self.replies.put(None)  # process ended

  def wait_ready(self):
    if self.ready is None:
      self.ready = self._reply("startup")
    return self.ready

  def _reply(self, what: str, timeout_s: float = REPLY_TIMEOUT_S):
    try:
      reply = self.replies.get(timeout=timeout_s)
    except queue.Empty:
      raise AssertionError(f"agent pid={self.proc.pid}: no reply to {what} within {timeout_s}s\n{self.tail()}")
    if reply is None:
      raise AssertionError(f"agent pid={self.proc.pid} exited ({self.proc.wait()}) during {what}\n{self.tail()}")
    if "error" in reply:
      raise AssertionError(f"agent pid={self.proc.pid} {what}: {reply['error']}\n{reply.get('traceback', '')}")
    return reply

  def send(self, op: str, **kw) -> None:
    self.wait_ready()
    self.proc.stdin.write((json.dumps({"op": op, **kw}) + "\n").encode())
    self.proc.stdin.flush()

  def call(self, op: str, timeout_s: float = REPLY_TIMEOUT_S, **kw) -> dict:
    self.send(op, **kw)
    return self._reply(op, timeout_s)

  def tail(self, n: int = 4000) -> str:
    self.log.flush()
    with open(self.log_path, "rb") as f:
      return f.read()[-n:].decode(errors="replace")

  def kill(self) -> int:
    if self.proc.poll() is None:
      self.proc.send_signal(signal.SIGKILL)
    return self.proc.wait()

  def stop(self) -> None:
    if self.proc.poll() is None:
      try:
        self.proc.stdin.write(b'{"op": "exit"}\n')
        self.proc.stdin.flush()
        self.proc.wait(timeout=10)
      except Exception:
        self.kill()
    self.log.close()


class Pool:
  """Hands out ready agents, keeping `spares` starting in the background."""

  def __init__(self, env: dict, log_dir: str, spares: int):
    self.env, self.log_dir, self.spares = env, log_dir, spares
    self.idle: list[Agent] = []
    self.all: list[Agent] = []
    self._fill()

  def _fill(self):
    while len(self.idle) < self.spares:
      agent = Agent(self.env, os.path.join(self.log_dir, f"agent-{len(self.all)}.log"))
      self.idle.append(agent)
      self.all.append(agent)

  def take(self) -> Agent:
    agent = self.idle.pop(0)
    self._fill()
    agent.wait_ready()
    return agent

  def close(self):
    for agent in self.all:
      agent.stop()


@pytest.fixture(scope="module")
def ray_address(tmp_path_factory):
  """A real local Ray cluster for this module (1 CPU, no dashboard) on 127.0.0.1, shut down at the end."""
  from jaxpod.transfer import ray_local
  with ray_local.local_cluster(num_cpus=1, include_dashboard=False, object_store_memory=256 << 20,
                               namespace=f"jaxpod_test_{uuid.uuid4().hex[:8]}", log_to_driver=False) as address:
    yield address


@pytest.fixture(scope="module")
def pool(ray_address, gcs, tmp_path_factory):
  """Worker processes joined to the module's Ray cluster, each with 4 fake CPU devices."""
  env = dict(os.environ, JAXPOD_TEST_RAY=ray_address, JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="4",
             XLA_FLAGS="--xla_force_host_platform_device_count=4", PYTHONUNBUFFERED="1")
  p = Pool(env, str(tmp_path_factory.mktemp("agents")), spares=2)
  try:
    yield p
  finally:
    p.close()


@pytest.fixture
def ray_namespace(ray_address):
  """A unique namespace for this test's coordinator actor; the actor is killed afterwards."""
  import ray
  ns = f"t_{uuid.uuid4().hex[:10]}"
  yield ns
  for name in ("weights",):
    try:
      ray.kill(ray.get_actor(name, namespace=ns), no_restart=True)
    except ValueError:
      pass


@pytest.fixture(scope="module")
def agents(pool):
  """Three standing worker processes reused by every test of the module: [trainer, client1, client2]."""
  standing = [pool.take() for _ in range(3)]
  yield standing


@pytest.fixture
def fresh(agents):
  """Drop servers/clients the previous test left in the standing agents."""
  yield agents
  for agent in agents:
    if agent.proc.poll() is None:
      agent.call("close")
