"""TRM under meshes: sharded training steps reproduce the reference (1 device) and each other.

Invariant 1 (same programs everywhere): every host lowers the one jitted train step with the
same global shapes, and a global-batch gradient already sums over hosts, so a sharded run gives
the unsharded results. The 1-device reference is the golden PyTorch run (test_trm_golden.py runs
the JAX model under a 1-device mesh against it); here (data=2, fsdp=2) on 4 devices must match the
golden step 1 (outputs, carry, loss, gradients) and a NumPy AdamATan2/SignSGD update from the
golden gradients, and 2 simulated hosts x 2 devices must match the 4-device run on both steps.
Tolerance: sharded reductions sum in another order (~1 ulp each): fp32 to 2e-5; ints/flags exact.
"""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file

from jaxpod.runtime import make_mesh

WORKER = Path(__file__).parent / "workers" / "trm_sharded_worker.py"
_spec = importlib.util.spec_from_file_location("trm_sharded_worker", WORKER)
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)
GOLDEN = worker.GOLDEN
TOL = dict(atol=2e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def fsdp_run():
  if len(jax.devices()) < 4:
    pytest.skip("needs 4 CPU devices (tests/conftest.py sets 8)")
  return worker.run_steps(make_mesh(data=2, fsdp=2, devices=jax.devices()[:4]))


def _np_first_update(p, g, lr, wd, sign_sgd):
  """Step 1 of the reference optimizers (warmup 1 -> full lr): SignSGD, or AdamATan2 from zero moments."""
  if sign_sgd:
    return p * (1 - lr * wd) - lr * np.sign(g)
  m, v = 0.1 * g, 0.05 * g * g
  return p * (1 - lr * wd) - lr / 0.1 * np.arctan2(m, np.sqrt(v) / math.sqrt(0.05))


def test_fsdp_mesh_matches_reference(fsdp_run):
  """(data=2, fsdp=2): parameters and optimizer state sharded along embed, the batch split 4 ways."""
  g1, grads, w = (load_file(str(GOLDEN / f)) for f in ("step1.safetensors", "grads.safetensors", "weights.safetensors"))
  for key in ("logits", "q_halt_logits", "z_H", "z_L"):
    np.testing.assert_allclose(fsdp_run[f"{key}/0"], g1[key], **TOL, err_msg=key)
  for key in ("steps", "halted"):
    np.testing.assert_array_equal(fsdp_run[f"{key}/0"], g1[key])
  np.testing.assert_allclose(fsdp_run["loss/0"], g1["loss"], rtol=2e-6)
  assert int(fsdp_run["lm_head_shard_rows"]) == 32  # lm_head [64, 11] split along embed over fsdp=2
  ref_grads = {  # golden grads are of the un-scaled loss; train_loss divides by the global batch (4)
      "lm_head": grads["inner.lm_head.weight"].T / 4,
      "qkv": grads["inner.L_level.layers.0.self_attn.qkv_proj.weight"].T.reshape(64, 3, 4, 16) / 4,
      "puzzle_emb": grads["inner.puzzle_emb.local_weights"].sum(0, keepdims=True) / 4,
  }
  ref_params = {"lm_head": w["inner.lm_head.weight"].T, "puzzle_emb": w["inner.puzzle_emb.weights"],
                "qkv": w["inner.L_level.layers.0.self_attn.qkv_proj.weight"].T.reshape(64, 3, 4, 16)}
  for name in ref_grads:
    got = fsdp_run[f"{name}_grad/0"]
    np.testing.assert_allclose(got, ref_grads[name], atol=1e-5 * np.abs(ref_grads[name]).max(), rtol=1e-4, err_msg=name)
    want = _np_first_update(ref_params[name], ref_grads[name], 1e-2, 1.0, sign_sgd=name == "puzzle_emb")
    np.testing.assert_allclose(fsdp_run[f"{name}_new/0"], want, atol=1e-6, rtol=1e-5, err_msg=name)


@pytest.mark.slow
@pytest.mark.multihost
def test_two_hosts_fsdp_matches_single_process(fsdp_run, launch_hosts, tmp_path):
  """2 simulated hosts x 2 devices, mesh (data=2, fsdp=2), the data axis spanning hosts: both steps."""
  out = tmp_path / "trm.npz"
  r = launch_hosts(WORKER, hosts=2, devices_per_host=2, args=[out, 2, 2, 1], timeout_s=240)
  assert r.returncode == 0, r.transcript
  with np.load(out) as f:
    got = dict(f)
  assert set(got) == set(fsdp_run)
  for key in sorted(fsdp_run):
    if fsdp_run[key].dtype.kind in "biu":
      np.testing.assert_array_equal(got[key], fsdp_run[key], err_msg=key)
    else:
      np.testing.assert_allclose(got[key], fsdp_run[key], **TOL, err_msg=key)
