"""Shared fixtures. Multi-host tests run real JAX processes through jaxpod's own launcher."""
from __future__ import annotations

import io
import itertools
import os
import signal
import sys
from pathlib import Path

import pytest

# Single-process tests see 8 CPU devices (meshes); launched hosts get their own count from init().
os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from jaxpod.runtime.hooks import Hook  # noqa: E402
from jaxpod.runtime.launcher import LaunchConfig, LaunchResult, launch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
_counter = itertools.count()


@pytest.fixture(autouse=True, scope="session")
def _isolated_compile_cache(tmp_path_factory):
  """Tests never write the user's compile cache."""
  os.environ["JAXPOD_COMPILE_CACHE"] = str(tmp_path_factory.mktemp("compile_cache"))


@pytest.fixture(scope="session")
def gcs():
  """A real GCS-API server (fake-gcs-server) on 127.0.0.1 for the session; every GCS client in this
  process and in launched hosts talks to it (gcsfs, TensorStore under Orbax, JAX's compile cache)."""
  from jaxpod.runtime.gcs_emulator import GCSServer
  with GCSServer() as server:
    saved = {k: os.environ.get(k) for k in server.env()}
    os.environ.update(server.env())
    yield server
    for k, v in saved.items():
      if v is None:
        os.environ.pop(k, None)
      else:
        os.environ[k] = v


@pytest.fixture(scope="session")
def hf_family(tmp_path_factory):
  """hf_family(name) -> (folder, torch model): the session's one tiny checkpoint of a decoder family
  (`tests/hf_families.py`), written by transformers on first use and shared by every test that asks for it."""
  from tests.hf_families import write_family_checkpoint
  made: dict = {}

  def get(family: str):
    if family not in made:
      folder = tmp_path_factory.mktemp(f"hf_{family}")
      made[family] = (str(folder), write_family_checkpoint(folder, family))
    return made[family]
  return get


@pytest.fixture
def bucket(gcs) -> str:
  """A fresh, empty bucket on the test GCS server: `gs://test-<suffix>`."""
  return gcs.new_bucket("test")


def launch_hosts_once(script, log_dir, hosts: int = 2, devices_per_host: int = 2, args=(), timeout_s: float = 180,
                      env: dict | None = None, grace_s: float = 5.0) -> LaunchResult:
  """Run a Python script as N isolated simulated hosts (each its own HOME, TMPDIR and working directory under
  `<log_dir>/hosts/host_<i>`), as on a pod: anything shared must go through a bucket (the `bucket` fixture)."""
  cfg = LaunchConfig(hosts=hosts, devices_per_host=devices_per_host, log_dir=str(log_dir), grace_s=grace_s,
                     timeout_s=timeout_s, hosts_root=str(Path(log_dir) / "hosts"))
  full_env = dict(os.environ, **(env or {}))
  full_env.pop("JAX_NUM_CPU_DEVICES", None)
  full_env.pop("JAXPOD_COMPILE_CACHE", None)  # a local folder shared by every host is what a pod lacks
  transcript = io.StringIO()
  result = launch([sys.executable, str(script), *map(str, args)], cfg, sink=transcript, summary=transcript,
                  env=full_env)
  result.transcript = transcript.getvalue()
  return result


@pytest.fixture
def launch_hosts(tmp_path):
  """launch_hosts(script, hosts=2, devices_per_host=2, args=[...]): `launch_hosts_once` under tmp_path."""

  def run(script, log_dir=None, **kwargs) -> LaunchResult:
    return launch_hosts_once(script, log_dir or tmp_path / f"launch_{next(_counter)}", **kwargs)

  return run


def compiles() -> list:
  """A list that grows by one name per XLA compilation (persistent-cache hits included) from now on."""
  import jax
  seen = []
  jax.monitoring.register_event_duration_secs_listener(
      lambda event, _, **kw: seen.append(kw.get("fun_name")) if event == "/jax/core/compile/backend_compile_duration"
      else None)
  return seen


def host_lines(result: LaunchResult, host: int, tag: str) -> list[str]:
  """Lines a host printed that start with `tag` (workers print `TAG value` lines for tests)."""
  return [l[len(tag):].strip() for l in result.output[host] if l.startswith(tag)]


class SigTermAt(Hook):
  """A trainer hook that sends this process SIGTERM at step `at`: a preemption notice, as a scheduler sends it (the
  trainer saves at the next step boundary and exits 143)."""

  def __init__(self, at: int):
    self.every, self.at = 1, at

  def __call__(self, info) -> None:
    if info.step == self.at:
      os.kill(os.getpid(), signal.SIGTERM)
