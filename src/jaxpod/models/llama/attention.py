"""Attention math of the static paths: `context` (masked softmax over given keys: a static-cache call), and
`self_attention`, attention over one call's own keys (training, scoring, a forward without a cache): by the kernel
`LlamaConfig.attention` picks (`kernels.py`: splash on TPU, cuDNN on GPU) or on XLA by `attend_own_keys`, block by
block of queries.

Without a cache a query in slot q sees key slots s <= q only. The plain form scores every query against every key
[B, K, G, T, T] and masks half of it away; here the queries go in blocks of `query_block(T)` rows and each block
is scored against the keys up to its last row only, so ~(n + 1) / 2n of the square is computed for n blocks (60%
at T = 303 in 64-row blocks). Each block's softmax spans all the keys its rows may see, so the result is the plain
form's up to float summation order. Why: on XLA:CPU the [T, T] scores, their softmax and gradients were 45% of a
GRPO train step at the long workload's 304 tokens; torch's fused attention skips the masked half.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxpod.models.llama import kernels

MIN_BLOCK = 64  # query rows per block at least (a call of fewer than 2 blocks is done in one)
MAX_BLOCKS = 8  # at most this many blocks (each is its own matmuls: the program grows with their number)


def query_block(t: int) -> int:
  """Query rows per block for a call of T new tokens: T itself (one block) below 2 x MIN_BLOCK."""
  return t if t < 2 * MIN_BLOCK else max(MIN_BLOCK, -(-t // MAX_BLOCKS))


def visible(q_pos, k_pos, window):
  """Sliding-window visibility of keys at k_pos from queries at q_pos (broadcast): all when window is None.
  window may be traced (a scan over layers of both kinds passes `stack.NO_WINDOW` for full ones)."""
  return True if window is None else (q_pos - k_pos < window)


def self_attention(cfg, q_BxTxHxE, k_BxKxTxE, v_BxKxTxE, kv_mask_BxT, positions_BxT, window):
  """Context [B, T, H, E] of a call's T tokens over their own keys: causal, keys where kv_mask_BxT is False hidden,
  and with a window only keys at positions within it (on positions). The kernel is `cfg.attention`'s
  (`kernels.choose`: splash on TPU, cuDNN on GPU, else the XLA form below)."""
  impl = kernels.choose(cfg, q_BxTxHxE.shape, q_BxTxHxE.dtype)
  if impl != "xla":
    return kernels.attend(impl, cfg, q_BxTxHxE, k_BxKxTxE, v_BxKxTxE, kv_mask_BxT, window)
  b, t, h, e = q_BxTxHxE.shape
  kvh = k_BxKxTxE.shape[1]
  slots_T = jnp.arange(t)
  mask_BxTxT = ((slots_T[None, None, :] <= slots_T[None, :, None]) & kv_mask_BxT[:, None, :]
                & visible(positions_BxT[:, :, None], positions_BxT[:, None, :], window))
  q_BxTxKxGxE = q_BxTxHxE.reshape(b, t, kvh, h // kvh, e)
  ctx = attend_own_keys(q_BxTxKxGxE, k_BxKxTxE, v_BxKxTxE, mask_BxTxT, cfg.attn_scale,
                        soft_cap=cfg.attn_logit_softcapping)
  return ctx.reshape(b, t, h, e)


def soft_capped(scores, cap: float | None):
  """cap * tanh(scores / cap) (Gemma 2's attention logit soft cap); the scores themselves without a cap."""
  return scores if cap is None else cap * jnp.tanh(scores / cap)


def context(q_BxTxKxGxE, keys_BxKxSxE, values_BxKxSxE, mask_BxTxS, scale: float, soft_cap: float | None = None):
  """softmax(q k * scale, soft-capped, masked) v over the given keys: [B, T, K, G, E] (float32 scores)."""
  scores = jnp.einsum("btkge,bkse->bkgts", q_BxTxKxGxE, keys_BxKxSxE, preferred_element_type=jnp.float32) * scale
  scores = soft_capped(scores, soft_cap)
  scores = jnp.where(mask_BxTxS[:, None, None], scores, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1).astype(values_BxKxSxE.dtype)
  return jnp.einsum("bkgts,bkse->btkge", probs, values_BxKxSxE)


def attend_own_keys(q_BxTxKxGxE, keys_BxKxTxE, values_BxKxTxE, mask_BxTxT, scale: float, block: int | None = None,
                    soft_cap: float | None = None):
  """Context [B, T, K, G, E] of queries over the call's own keys, `mask_BxTxT` (causal and any padding or window
  rule) applied; `block` query rows at a time (default `query_block(T)`), each against keys 0 .. its last row."""
  t = q_BxTxKxGxE.shape[1]
  block = query_block(t) if block is None else block
  out = []
  for i0 in range(0, t, block):
    i1 = min(i0 + block, t)  # rows i0..i1-1 see keys below i1 at most (causal)
    out.append(context(q_BxTxKxGxE[:, i0:i1], keys_BxKxTxE[:, :, :i1], values_BxKxTxE[:, :, :i1],
                       mask_BxTxT[:, i0:i1, :i1], scale, soft_cap))
  return out[0] if len(out) == 1 else jnp.concatenate(out, axis=1)
