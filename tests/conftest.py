"""Shared fixtures. Multi-host tests run real JAX processes through jaxpod's own launcher."""
from __future__ import annotations

import io
import itertools
import os
import sys
from pathlib import Path

import pytest

# Single-process tests see 8 CPU devices (meshes); launched hosts get their own count from init().
os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from jaxpod.runtime.launcher import LaunchConfig, LaunchResult, launch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
_counter = itertools.count()


@pytest.fixture(autouse=True, scope="session")
def _isolated_compile_cache(tmp_path_factory):
  """Tests never write the user's compile cache."""
  os.environ["JAXPOD_COMPILE_CACHE"] = str(tmp_path_factory.mktemp("compile_cache"))


@pytest.fixture
def launch_hosts(tmp_path):
  """Run a Python script as N simulated hosts: launch_hosts(script, hosts=2, devices_per_host=2, args=[...])."""

  def run(script, hosts: int = 2, devices_per_host: int = 2, args=(), timeout_s: float = 180,
          env: dict | None = None, grace_s: float = 5.0) -> LaunchResult:
    log_dir = tmp_path / f"launch_{next(_counter)}"
    cfg = LaunchConfig(hosts=hosts, devices_per_host=devices_per_host, log_dir=str(log_dir), grace_s=grace_s,
                       timeout_s=timeout_s)
    full_env = dict(os.environ, **(env or {}))
    full_env.pop("JAX_NUM_CPU_DEVICES", None)
    transcript = io.StringIO()
    result = launch([sys.executable, str(script), *map(str, args)], cfg, sink=transcript, summary=transcript,
                    env=full_env)
    result.transcript = transcript.getvalue()
    return result

  return run


def host_lines(result: LaunchResult, host: int, tag: str) -> list[str]:
  """Lines a host printed that start with `tag` (workers print `TAG value` lines for tests)."""
  return [l[len(tag):].strip() for l in result.output[host] if l.startswith(tag)]
