"""Attention math of the static paths: `context` (masked softmax over given keys: a static-cache call), and
`attend_own_keys`, attention over one call's own keys (training, a forward without a cache) block by block of queries.

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

MIN_BLOCK = 64  # query rows per block at least (a call of fewer than 2 blocks is done in one)
MAX_BLOCKS = 8  # at most this many blocks (each is its own matmuls: the program grows with their number)


def query_block(t: int) -> int:
  """Query rows per block for a call of T new tokens: T itself (one block) below 2 x MIN_BLOCK."""
  return t if t < 2 * MIN_BLOCK else max(MIN_BLOCK, -(-t // MAX_BLOCKS))


def context(q_BxTxKxGxE, keys_BxKxSxE, values_BxKxSxE, mask_BxTxS, scale: float):
  """softmax(q k * scale, masked) v over the given keys: [B, T, K, G, E] (float32 scores)."""
  scores = jnp.einsum("btkge,bkse->bkgts", q_BxTxKxGxE, keys_BxKxSxE, preferred_element_type=jnp.float32) * scale
  scores = jnp.where(mask_BxTxS[:, None, None], scores, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1).astype(values_BxKxSxE.dtype)
  return jnp.einsum("bkgts,bkse->btkge", probs, values_BxKxSxE)


def attend_own_keys(q_BxTxKxGxE, keys_BxKxTxE, values_BxKxTxE, mask_BxTxT, scale: float, block: int | None = None):
  """Context [B, T, K, G, E] of queries over the call's own keys, `mask_BxTxT` (causal and any padding or window
  rule) applied; `block` query rows at a time (default `query_block(T)`), each against keys 0 .. its last row."""
  t = q_BxTxKxGxE.shape[1]
  block = query_block(t) if block is None else block
  out = []
  for i0 in range(0, t, block):
    i1 = min(i0 + block, t)  # rows i0..i1-1 see keys below i1 at most (causal)
    out.append(context(q_BxTxKxGxE[:, i0:i1], keys_BxKxTxE[:, :, :i1], values_BxKxTxE[:, :, :i1],
                       mask_BxTxT[:, i0:i1, :i1], scale))
  return out[0] if len(out) == 1 else jnp.concatenate(out, axis=1)
