"""TRM under meshes: the same training trajectory on 1 device, on (data=2, fsdp=2), and on 2 hosts.

Invariant 1 (same programs everywhere): every host lowers the one jitted train step with the
same global shapes, and a global-batch gradient already sums over hosts, so the sharded runs
reproduce the 1-device run. Tolerance: sharded reductions sum in another order (~1 ulp per
reduction), so fp32 values agree to 1e-5; integers and flags exactly.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxpod.runtime import make_mesh

WORKER = Path(__file__).parent / "workers" / "trm_sharded_worker.py"
_spec = importlib.util.spec_from_file_location("trm_sharded_worker", WORKER)
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)
pytestmark = pytest.mark.skipif(not (worker.GOLDEN / "weights.safetensors").exists(), reason="golden TRM files not found")


@pytest.fixture(scope="module")
def one_device():
  return worker.run_steps(make_mesh(data=1, devices=jax.devices()[:1]))


def _assert_same(got, want):
  assert set(got) == set(want)
  for key in sorted(want):
    if want[key].dtype.kind in "biu":
      np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    else:
      np.testing.assert_allclose(got[key], want[key], atol=1e-5, rtol=1e-5, err_msg=key)


@pytest.mark.skipif(len(jax.devices()) < 4, reason="needs 4 CPU devices (tests/conftest.py sets 8)")
def test_fsdp_mesh_matches_one_device(one_device):
  """(data=2, fsdp=2) on 4 devices: parameters and optimizer state sharded along embed, batch split 4 ways."""
  _assert_same(worker.run_steps(make_mesh(data=2, fsdp=2, devices=jax.devices()[:4])), one_device)


@pytest.mark.slow
@pytest.mark.multihost
def test_two_hosts_fsdp_matches_one_device(one_device, launch_hosts, tmp_path):
  """2 simulated hosts x 2 devices, mesh (data=2, fsdp=2): the data axis spans the hosts."""
  out = tmp_path / "trm.npz"
  r = launch_hosts(WORKER, hosts=2, devices_per_host=2, args=[out, 2, 2, 1], timeout_s=240)
  assert r.returncode == 0, r.transcript
  with np.load(out) as f:
    _assert_same(dict(f), one_device)
