"""Smoke test of examples/rl_loop: a trainer process publishes, a worker process samples with
the newest weights and logs the weight id each sample used."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_rl_loop_example_checkpoint_mode():
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("JAX_NUM_CPU_DEVICES", None)
  out = subprocess.run([sys.executable, os.path.join(REPO, "examples", "rl_loop", "run.py"), "--mode", "checkpoint",
                        "--steps", "20", "--every", "10"], env=env, capture_output=True, text=True, timeout=180)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  assert "trainer: published weight_id=20" in out.stdout
  assert "used weight_id=20" in out.stdout, out.stdout[-3000:]
