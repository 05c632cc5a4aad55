"""Optimizer wrappers the trainer's tasks share.

    tx = float32_moments(optax.adamw(lr))   # bf16 params, float32 Adam moments and update math

With `model.param_dtype: float32` the master weights and every moment are float32 already; this is the
option between: weights stored in bf16 (half the bytes), moments and the update computed in float32 so
small second moments do not flush to zero (bf16 keeps 8 bits of mantissa; nu ~ g^2 underflows first).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def _f32(tree):
  return jax.tree.map(lambda x: x.astype(jnp.float32) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


def float32_moments(inner: optax.GradientTransformation) -> optax.GradientTransformation:
  """`inner` run on float32 copies of the gradients and params; its state float32; updates cast back to
  each param's dtype."""

  def init(params):
    return inner.init(_f32(params))

  def update(grads, state, params=None):
    updates, state = inner.update(_f32(grads), state, None if params is None else _f32(params))
    like = grads if params is None else params
    return jax.tree.map(lambda u, p: u.astype(p.dtype), updates, like), state

  return optax.GradientTransformation(init, update)
