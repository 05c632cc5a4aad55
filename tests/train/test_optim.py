"""float32_moments: bf16 weights, float32 Adam state and update math (issue 50, mixed precision)."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxpod.train.optim import float32_moments


def _params(dtype):
  rng = np.random.default_rng(0)
  return {"w": jnp.asarray(rng.normal(size=(4, 8)), dtype), "b": jnp.asarray(rng.normal(size=(8,)), dtype)}


def test_the_moments_of_bf16_params_are_float32_and_the_updates_keep_the_params_dtype():
  params = _params(jnp.bfloat16)
  tx = float32_moments(optax.adamw(1e-3))
  state = tx.init(params)
  floats = [x for x in jax.tree.leaves(state) if jnp.issubdtype(x.dtype, jnp.floating)]
  assert floats and all(x.dtype == jnp.float32 for x in floats)
  updates, state = tx.update(jax.tree.map(lambda p: p * 0.5, params), state, params)
  assert all(u.dtype == jnp.bfloat16 for u in jax.tree.leaves(updates))
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state) if jnp.issubdtype(x.dtype, jnp.floating))


def test_the_update_is_the_float32_update_rounded_once_to_bf16():
  params = _params(jnp.bfloat16)
  grads = jax.tree.map(lambda p: p * 1e-3, params)
  tx = float32_moments(optax.adamw(1e-2, weight_decay=0.1))
  updates, _ = tx.update(grads, tx.init(params), params)
  f32 = jax.tree.map(lambda x: x.astype(jnp.float32), params)
  ref_tx = optax.adamw(1e-2, weight_decay=0.1)
  ref, _ = ref_tx.update(jax.tree.map(lambda x: x.astype(jnp.float32), grads), ref_tx.init(f32), f32)
  for u, r in zip(jax.tree.leaves(updates), jax.tree.leaves(ref)):
    np.testing.assert_array_equal(np.asarray(u), np.asarray(r.astype(jnp.bfloat16)))


def test_on_float32_params_it_is_the_inner_optimizer_exactly():
  params = _params(jnp.float32)
  grads = jax.tree.map(lambda p: p * 0.3, params)
  a, b = optax.adamw(1e-2), float32_moments(optax.adamw(1e-2))
  ua, _ = a.update(grads, a.init(params), params)
  ub, _ = b.update(grads, b.init(params), params)
  for x, y in zip(jax.tree.leaves(ua), jax.tree.leaves(ub)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_adamw_config_names_its_field_for_a_moment_dtype_it_does_not_know():
  from jaxpod.policy.llama_task import AdamWConfig
  with pytest.raises(ValueError, match="task.optim.moment_dtype"):
    AdamWConfig(moment_dtype="bfloat16")
  tx, _ = AdamWConfig(moment_dtype="float32").build(100)
  state = tx.init(_params(jnp.bfloat16))
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state) if jnp.issubdtype(x.dtype, jnp.floating))
