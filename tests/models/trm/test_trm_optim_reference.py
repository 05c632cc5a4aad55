"""jaxpod's TRM optimizers against the reference's own PyTorch code, over many steps with weight decay.

- AdamATan2: `_adam_atan2_reference_impl` from the reference's `adam_atan2_reference/adam_atan2_test.py`
  (the pure-PyTorch formula the CUDA-only optimizer of `pretrain.py` is tested against), read from
  that file in place (its test module imports the CUDA extension, so only the function is compiled).
- SignSGD: the reference's `CastedSparseEmbedding` + `CastedSparseEmbeddingSignSGD_Distributed`
  (world_size 1), against jaxpod's `sign_sgd` on the gradient that `jax.grad` gives through a gather.
  Tolerance: fp32 on both sides; the formulas are the same operations, so differences are ulps.
"""
from __future__ import annotations

import ast
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxpod.models import trm
from tests.models.trm.conftest import reference_on_path


def _reference_adam_atan2(ref):
  """The function `_adam_atan2_reference_impl`, compiled from the reference file alone."""
  import torch
  path = ref / "adam_atan2_reference" / "adam_atan2_test.py"
  tree = ast.parse(path.read_text(), filename=str(path))
  fn = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_adam_atan2_reference_impl"]
  if not fn:
    raise RuntimeError(f"{path}: no _adam_atan2_reference_impl (is this the adam-atan2 0.0.3 test file?)")
  namespace = {"torch": torch, "Tuple": tuple}
  exec(compile(ast.Module(body=fn, type_ignores=[]), str(path), "exec"), namespace)
  return namespace["_adam_atan2_reference_impl"]


@pytest.mark.parametrize("shape,base_lr,weight_decay", [((4096,), 1e-3, 0.1), ((64, 48), 1e-4, 1.0),
                                                        ((7, 5), 3e-3, 0.03)])
def test_adam_atan2_matches_reference_formula(trm_reference, shape, base_lr, weight_decay):
  """100 steps (warmup then constant lr), fp32 both sides: parameters and moments within 1e-6."""
  import torch
  ref_step = _reference_adam_atan2(trm_reference)
  b1, b2, warmup, steps = 0.9, 0.95, 10, 100
  gen = torch.Generator().manual_seed(0)
  p_ref = torch.empty(shape, dtype=torch.float32).normal_(std=0.02, generator=gen)
  m_ref, v_ref = torch.zeros_like(p_ref), torch.zeros_like(p_ref)
  tx = trm.adam_atan2(trm.warmup_schedule(base_lr, warmup), b1=b1, b2=b2, weight_decay=weight_decay)
  p0 = p_ref.numpy().copy()
  p = jnp.asarray(p0)
  state = tx.init(p)
  update = jax.jit(tx.update)
  for t in range(1, steps + 1):
    g = torch.empty(shape, dtype=torch.float32).normal_(std=1e-3 if t % 7 else 1.0, generator=gen)
    lr = base_lr * min(1.0, t / warmup)  # the reference's compute_lr at step t (constant after warmup)
    p_ref, m_ref, v_ref = ref_step(p_ref, g, m_ref, v_ref, step_size=lr / (1 - b1 ** t),
                                   wd_step_size=lr * weight_decay, bias_correction2_sqrt=math.sqrt(1 - b2 ** t),
                                   beta1=b1, beta2=b2)
    u, state = update(jnp.asarray(g.numpy()), state, p)
    p = optax.apply_updates(p, u)
  assert int(state.count) == steps
  np.testing.assert_allclose(np.asarray(p), p_ref.numpy(), rtol=0, atol=1e-6)
  np.testing.assert_allclose(np.asarray(state.mu), m_ref.numpy(), rtol=1e-5, atol=1e-9)
  np.testing.assert_allclose(np.asarray(state.nu), v_ref.numpy(), rtol=1e-5, atol=1e-12)
  assert np.abs(np.asarray(p) - p0).max() > 10 * base_lr  # the comparison is not between unmoved parameters


def test_sign_sgd_matches_reference_sparse_optimizer(trm_reference):
  """Six steps of the reference sparse embedding + its sign-SGD (repeated ids in a batch) against jaxpod."""
  import torch
  with reference_on_path(trm_reference):
    from models.sparse_embedding import CastedSparseEmbedding, CastedSparseEmbeddingSignSGD_Distributed
  num_ids, dim, batch, lr, wd = 9, 16, 8, 0.01, 0.1
  torch.manual_seed(0)
  emb = CastedSparseEmbedding(num_ids, dim, batch_size=batch, init_std=1.0, cast_to=torch.float32)
  emb.train()
  opt = CastedSparseEmbeddingSignSGD_Distributed(list(emb.buffers()), world_size=1, lr=lr, weight_decay=wd)
  w0 = emb.weights.numpy().copy()
  w = jnp.asarray(w0)
  tx = trm.sign_sgd(lr, weight_decay=wd)
  state = tx.init(w)
  rng = np.random.default_rng(0)
  for _ in range(6):
    ids = rng.integers(0, num_ids - 2, batch)  # the last two rows are never used: they must not move
    ids[1] = ids[0]  # a repeated id: its row gradients are summed before the sign
    row_grads = rng.normal(size=(batch, dim)).astype(np.float32)
    out = emb(torch.as_tensor(ids, dtype=torch.int32))
    (out * torch.as_tensor(row_grads)).sum().backward()
    opt.step()
    opt.zero_grad()
    g = jax.grad(lambda table: jnp.sum(table[ids] * row_grads))(w)  # what jax.grad gives through the model's gather
    u, state = tx.update(g, state, w)
    w = optax.apply_updates(w, u)
  np.testing.assert_allclose(np.asarray(w), emb.weights.numpy(), rtol=0, atol=1e-6)
  np.testing.assert_array_equal(np.asarray(w)[-2:], w0[-2:])  # unused rows: no update, no weight decay
  assert np.abs(np.asarray(w)[:-2] - w0[:-2]).min() > 0
