"""TRM optimizers against a NumPy transcription of the reference update formulas, over several steps."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxpod.models import trm


def _np_adam_atan2(p, grads, lrs, b1, b2, wd):
  """The reference AdamATan2 step, transcribed: p *= 1-lr*wd; lerp moments; atan2 step."""
  p = p.astype(np.float64)
  m = np.zeros_like(p)
  v = np.zeros_like(p)
  for t, (g, lr) in enumerate(zip(grads, lrs), start=1):
    p = p * (1 - lr * wd)
    m = m + (1 - b1) * (g - m)
    v = v + (1 - b2) * (g * g - v)
    p = p - (lr / (1 - b1 ** t)) * np.arctan2(m, np.sqrt(v) / math.sqrt(1 - b2 ** t))
  return p


def _np_sign_sgd(w, ids_per_step, row_grads_per_step, lrs, wd):
  """The reference sparse SignSGD: scatter-add row grads by id, update only those ids' rows."""
  w = w.astype(np.float64)
  for ids, row_grads, lr in zip(ids_per_step, row_grads_per_step, lrs):
    uniq, inv = np.unique(ids, return_inverse=True)
    grad = np.zeros((len(uniq), w.shape[1]))
    np.add.at(grad, inv, row_grads)
    w[uniq] = w[uniq] * (1 - lr * wd) - lr * np.sign(grad)
  return w


def _ref_lr(step, base, warmup, total=0, min_ratio=1.0):
  if step < warmup:
    return base * step / max(1, warmup)
  progress = (step - warmup) / max(1, total - warmup)
  return base * (min_ratio + max(0.0, (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))))


def test_warmup_schedule_matches_reference_compute_lr():
  """optax count k (0-based) gets the reference lr of step k+1, warmup then cosine."""
  sched = trm.warmup_schedule(1e-3, 5, total_steps=20, min_ratio=0.1)
  for k in range(25):
    np.testing.assert_allclose(float(sched(k)), _ref_lr(k + 1, 1e-3, 5, 20, 0.1), rtol=1e-6)
  const = trm.warmup_schedule(1e-4, 3)
  np.testing.assert_allclose([float(const(k)) / 1e-4 for k in range(5)], [1 / 3, 2 / 3, 1, 1, 1], rtol=1e-6)


def test_adam_atan2_matches_numpy():
  """Five AdamATan2 steps with a warmup lr and weight decay, elementwise against NumPy."""
  rng = np.random.default_rng(0)
  p0 = rng.normal(size=(6, 5)).astype(np.float32)
  grads = [rng.normal(size=p0.shape).astype(np.float32) * s for s in (1.0, 0.1, 3.0, 1e-3, 0.5)]
  grads[2][0, 0] = 0.0
  sched = trm.warmup_schedule(1e-2, 3)
  tx = trm.adam_atan2(sched, b1=0.9, b2=0.95, weight_decay=1.0)
  p = jnp.asarray(p0)
  state = tx.init(p)
  update = jax.jit(tx.update)
  for g in grads:
    u, state = update(jnp.asarray(g), state, p)
    p = optax.apply_updates(p, u)
  expected = _np_adam_atan2(p0, grads, [_ref_lr(k, 1e-2, 3) for k in range(1, 6)], 0.9, 0.95, 1.0)
  np.testing.assert_allclose(np.asarray(p), expected, rtol=1e-5, atol=1e-7)


def test_sign_sgd_on_embedding_gradient_matches_sparse_reference():
  """The table gradient of a gather sums rows that share an id; SignSGD updates only used rows."""
  rng = np.random.default_rng(1)
  w0 = rng.normal(size=(5, 4)).astype(np.float32)
  ids_per_step = [np.array([0, 2, 2, 4]), np.array([1, 1, 1, 3]), np.array([4, 0, 4, 0])]
  row_grads = [rng.normal(size=(4, 4)).astype(np.float32) for _ in ids_per_step]
  tx = trm.sign_sgd(0.05, weight_decay=0.5)
  w = jnp.asarray(w0)
  state = tx.init(w)
  for ids, rg in zip(ids_per_step, row_grads):
    # Gradient of sum(table[ids] * rg) wrt the table: what jax.grad gives through the model's gather.
    g = jax.grad(lambda t: jnp.sum(t[ids] * rg))(w)
    u, state = tx.update(g, state, w)
    w = optax.apply_updates(w, u)
  expected = _np_sign_sgd(w0, ids_per_step, row_grads, [0.05] * 3, 0.5)
  np.testing.assert_allclose(np.asarray(w), expected, rtol=1e-6, atol=1e-7)


def test_make_optimizer_partitions_by_path():
  """The puzzle table gets SignSGD, every other parameter AdamATan2; buffers are not optimized."""
  model = nnx.eval_shape(lambda: trm.TRM(trm.TRMConfig.tiny(), rngs=nnx.Rngs(0)))
  rng = np.random.default_rng(0)
  for _, var in nnx.iter_graph(model):
    if isinstance(var, nnx.Variable):
      var.set_value(jnp.asarray(rng.normal(size=var.shape), jnp.float32))
  _, params, buffers = trm.split_model(model)
  labels = jax.tree.leaves(trm.param_labels(params))
  assert labels.count(trm.optim.PUZZLE_EMB) == 1 and len(set(labels)) == 2
  assert "H_init" in buffers and "H_init" not in params
  ocfg = trm.TRMOptimConfig(lr=1e-2, puzzle_emb_lr=1e-1, warmup_steps=1, weight_decay=0.1, puzzle_emb_weight_decay=0.1)
  tx = trm.make_optimizer(ocfg)
  grads = jax.tree.map(jnp.ones_like, params)
  state = tx.init(params)
  updates, state = jax.jit(tx.update)(grads, state, params)
  emb = np.asarray(params["puzzle_emb"][...])
  np.testing.assert_allclose(np.asarray(updates["puzzle_emb"][...]), -0.1 * 0.1 * emb - 0.1, rtol=1e-6)
  lm = np.asarray(params["lm_head"][...])
  # First AdamATan2 step with g = 1: m = 0.1, v = 0.05, so the step is lr/(1-0.9) * atan2(0.1, 1).
  expected = -1e-2 * 0.1 * lm - 1e-2 / 0.1 * math.atan2(0.1, 1.0)
  np.testing.assert_allclose(np.asarray(updates["lm_head"][...]), expected, rtol=1e-5)


@pytest.mark.parametrize("field,value", [("beta2", 1.0), ("lr", -1.0), ("lr_min_ratio", 0.5)])
def test_optim_config_validation(field, value):
  with pytest.raises(ValueError, match=field):
    trm.TRMOptimConfig(**{field: value})
