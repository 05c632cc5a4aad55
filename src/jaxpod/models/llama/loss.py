"""Per-token log-probs of the Llama decoder without its [B, T, V] logits, and the next-token (causal LM) loss.

    logp_BxT = token_logps(graphdef, params, inputs_BxT, targets_BxT)          # log softmax(logits)[target]
    loss, sums = next_token_loss(graphdef, params, tokens_BxT, mask_BxT)       # what a causal-LM train step takes

Every training loss of jaxpod (causal LM, the preference losses, GRPO) reads its model through `token_logps`: the
decoder runs to the final-normed hidden [B, T, D], then the vocab head and the log-prob run `CHUNK` positions at a
time in a scan, each chunk recomputed in the backward pass, so at most [B, CHUNK, V] float32 logits exist at once.
Why: Llama-3's vocabulary is 128,256, so one 4096-token row's float32 logits are 2 GiB, and their log-softmax and
its gradient as much again; compiled for v5p they were ~6 GiB of the 8B train step's 59.7 GiB per chip.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from jaxpod.models.llama.model import head_logits

CHUNK = 128  # positions per chunk of the vocab head ([B, 128, V] float32 logits at a time)


def target_logps(logits_BxCxV, targets_BxC):
  """log softmax(logits)[target] in float32 [B, C]: the target's logit minus a logsumexp (no [B, C, V] log-softmax)."""
  logits = logits_BxCxV.astype(jnp.float32)
  at = jnp.take_along_axis(logits, targets_BxC[..., None].astype(jnp.int32), axis=-1)[..., 0]
  return at - jax.nn.logsumexp(logits, axis=-1)


def chunked_logps(h_BxTxD, w_DxV, targets_BxT, logp: Callable = target_logps, chunk: int = CHUNK):
  """logp(h @ w, targets) float32 [B, T], `chunk` positions at a time in a scan (each chunk's logits recomputed in
  the backward pass); T is padded to a multiple of the chunk and the padding cut off."""
  b, t, d = h_BxTxD.shape
  c = max(1, min(chunk, t))
  n = -(-t // c)
  pad = n * c - t
  if pad:
    h_BxTxD = jnp.pad(h_BxTxD, ((0, 0), (0, pad), (0, 0)))
    targets_BxT = jnp.pad(targets_BxT, ((0, 0), (0, pad)))
  h_NxBxCxD = h_BxTxD.reshape(b, n, c, d).swapaxes(0, 1)
  t_NxBxC = targets_BxT.reshape(b, n, c).swapaxes(0, 1)

  @jax.checkpoint
  def piece(h_BxCxD, t_BxC):
    return logp(head_logits(h_BxCxD, w_DxV), t_BxC)

  if n == 1:
    out_BxT = piece(h_NxBxCxD[0], t_NxBxC[0])
  else:
    _, out_NxBxC = jax.lax.scan(lambda carry, xs: (carry, piece(*xs)), None, (h_NxBxCxD, t_NxBxC))
    out_BxT = out_NxBxC.swapaxes(0, 1).reshape(b, n * c)
  return out_BxT[:, :t]


def token_logps(graphdef, weights, inputs_BxT, targets_BxT, logp: Callable = target_logps, chunk: int = CHUNK,
                **forward_kw):
  """`logp(logits, targets)` float32 [B, T] of the model's logits on inputs_BxT, never holding [B, T, V] logits."""
  from flax import nnx
  model = nnx.merge(graphdef, weights)
  h_BxTxD = model(inputs_BxT, return_hidden=True, **forward_kw).logits
  return chunked_logps(h_BxTxD, model.head_weight(), targets_BxT, logp, chunk)


def next_token_loss(graphdef, params, tokens_BxT, mask_BxT=None):
  """Mean cross-entropy of predicting tokens[:, 1:] from tokens[:, :-1]; mask_BxT marks real tokens.

  Returns (loss, {"loss_sum", "tokens"}) so data-parallel callers can also sum exactly.
  """
  targets = tokens_BxT[:, 1:]
  ce = -token_logps(graphdef, params, tokens_BxT[:, :-1], targets)  # [B, T-1] float32
  valid = jnp.ones(targets.shape, bool) if mask_BxT is None else (mask_BxT[:, 1:] & mask_BxT[:, :-1])
  total = jnp.sum(jnp.where(valid, ce, 0.0))
  count = jnp.maximum(jnp.sum(valid), 1)
  return total / count, {"loss_sum": total, "tokens": count}


def loss_and_grad(graphdef):
  """`jax.value_and_grad` of `next_token_loss` w.r.t. params (has_aux)."""
  return jax.value_and_grad(lambda p, t, m=None: next_token_loss(graphdef, p, t, m), has_aux=True)
