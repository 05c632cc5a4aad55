"""Next-token (causal LM) loss for the Llama decoder, for a trainer's pure train step."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from jaxpod.models.llama.model import forward


def next_token_loss(graphdef, params, tokens_BxT, mask_BxT=None):
  """Mean cross-entropy of predicting tokens[:, 1:] from tokens[:, :-1]; mask_BxT marks real tokens.

  Returns (loss, {"loss_sum", "tokens"}) so data-parallel callers can also sum exactly.
  """
  logits = forward(graphdef, params, tokens_BxT[:, :-1]).logits  # [B, T-1, V] float32
  targets = tokens_BxT[:, 1:]
  valid = jnp.ones(targets.shape, bool) if mask_BxT is None else (mask_BxT[:, 1:] & mask_BxT[:, :-1])
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
  total = jnp.sum(jnp.where(valid, ce, 0.0))
  count = jnp.maximum(jnp.sum(valid), 1)
  return total / count, {"loss_sum": total, "tokens": count}


def loss_and_grad(graphdef):
  """`jax.value_and_grad` of `next_token_loss` w.r.t. params (has_aux)."""
  return jax.value_and_grad(lambda p, t, m=None: next_token_loss(graphdef, p, t, m), has_aux=True)
