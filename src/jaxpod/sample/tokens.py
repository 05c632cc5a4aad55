"""What both engines share: a `Completion`, and how the next token is chosen (`sample_tokens`).

`filtered_top` is the one definition of the temperature / top-k / top-p distribution: the engine
draws from it and records the log-prob of the drawn token under it, and a trainer that recomputes
those log-probs (`token_logprobs`) uses it too, so on-policy ratios are exactly 1 whatever the filter.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxpod.sample.config import SamplingParams

NO_TOKEN = -1  # out-buffer value after a row has stopped


class Completion(NamedTuple):
  """One sample of one request: every sampled token with its log-prob and the weights version that made it."""

  sampled: tuple[int, ...]  # every sampled token, the stop token included (RL trains on the stop token)
  finish_reason: str  # "stop" (the last sampled token is a stop id) | "length"
  logprobs: tuple[float, ...]  # one per sampled token (see `sample_tokens`)
  versions: tuple[int, ...]  # one per sampled token: the weights version that produced it
  request: int  # request number (submission order; generate: the prompt's index)
  sample: int  # j in 0..n-1

  @property
  def tokens(self) -> list[int]:
    """The sampled tokens without the stop token (what `jaxpod sample` writes)."""
    return list(self.sampled[:-1] if self.finish_reason == "stop" else self.sampled)


LOGPROB_FLOOR = -30.0  # token_logprobs of a token the filter leaves out (finite: its ratio is ~0, never NaN)


def filtered_top(logits_NxV, sp: SamplingParams):
  """The distribution a token is drawn from at temperature sp.temperature > 0: softmax(vals_NxK) over the
  candidates idx_NxK (sorted, most likely first; filtered ones have val -inf, the rest are renormalised).

  idx is None when nothing is filtered (vals are then logits / T over the whole vocabulary, in order).
  Returns (vals_NxK float32, idx_NxK int32 | None)."""
  logits = logits_NxV.astype(jnp.float32) / sp.temperature
  k = sp.top_k if sp.top_k > 0 else (logits.shape[-1] if sp.top_p < 1 else 0)
  if k == 0:
    return logits, None
  vals_NxK, idx_NxK = jax.lax.top_k(logits, k)
  if sp.top_p < 1:
    probs = jax.nn.softmax(vals_NxK, axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs  # mass strictly above each candidate
    vals_NxK = jnp.where(before < sp.top_p, vals_NxK, -jnp.inf)  # the first one always stays
  return vals_NxK, idx_NxK


def sample_tokens(logits_BxV, keys_B, sp: SamplingParams):
  """Next token per row and its log-probability (float32): greedy, or temperature / top-k / top-p with per-row keys.

  The log-prob is that of the token under the distribution it was drawn from:
    temperature T > 0: log softmax(logits / T) at the token, after the top-k and top-p filters
                       (`filtered_top`: filtered tokens have probability 0, the rest are renormalised);
    greedy (T = 0):    log_softmax(logits) at the argmax (temperature 1, unfiltered): the model's own
                       probability of the chosen token.
  A draw takes one uniform number per row (inverse CDF, `categorical`).
  Returns (tokens [B] int32, logprobs [B] float32)."""
  if sp.temperature == 0:
    logits = logits_BxV.astype(jnp.float32)
    tok_B = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return tok_B, jnp.max(logits, axis=-1) - jax.nn.logsumexp(logits, axis=-1)  # the argmax's logit is the max
  vals_BxK, idx_BxK = filtered_top(logits_BxV, sp)
  choice_B = categorical(keys_B, vals_BxK)
  tok_B = choice_B if idx_BxK is None else jnp.take_along_axis(idx_BxK, choice_B[:, None], axis=1)[:, 0]
  return tok_B.astype(jnp.int32), _logprob_at(vals_BxK, choice_B)


def token_logprobs(logits_BxTxV, targets_BxT, sp: SamplingParams):
  """log-prob of each target under the distribution `sample_tokens` records for it, float32 [B, T]: what a
  trainer recomputes for the engine's tokens (differentiable in the logits; the filter's kept set is a
  constant of the forward pass). Greedy: log_softmax(logits) (temperature 1, unfiltered). A target the
  filter leaves out gets LOGPROB_FLOOR."""
  b, t, v = logits_BxTxV.shape
  if sp.temperature == 0:
    sp = SamplingParams(temperature=1.0)
  vals_NxK, idx_NxK = filtered_top(logits_BxTxV.reshape(b * t, v), sp)
  targets_N = targets_BxT.reshape(b * t).astype(jnp.int32)
  if idx_NxK is None:
    return _logprob_at(vals_NxK, targets_N).reshape(b, t)
  hit_NxK = (idx_NxK == targets_N[:, None]) & jnp.isfinite(vals_NxK)
  at_N = jnp.sum(jnp.where(hit_NxK, vals_NxK, 0.0), axis=-1)
  logp_N = jnp.where(jnp.any(hit_NxK, axis=-1), at_N - jax.nn.logsumexp(vals_NxK, axis=-1), LOGPROB_FLOOR)
  return logp_N.reshape(b, t)


def categorical(keys_B, logits_BxV, block: int = 128):
  """One draw per row from softmax(logits) by inverse CDF with one uniform number per row (Gumbel-max would draw
  V of them: on CPU the random bits cost more than the model's vocab head). The CDF is found in two levels,
  block sums then one block, so the work stays O(V). Tokens of probability 0 are never drawn."""
  b, v = logits_BxV.shape
  nb = -(-v // block)
  p = jnp.exp(logits_BxV - jnp.max(logits_BxV, axis=-1, keepdims=True))  # unnormalised; -inf -> 0
  p_BxNxS = jnp.pad(p, ((0, 0), (0, nb * block - v))).reshape(b, nb, block)
  cum_BxN = jnp.cumsum(p_BxNxS.sum(-1), axis=-1)
  target_B = jax.vmap(lambda key: jax.random.uniform(key, (), jnp.float32))(keys_B) * cum_BxN[:, -1]
  j_B = jnp.minimum(jnp.sum(cum_BxN <= target_B[:, None], axis=-1), nb - 1)  # the block holding the target
  before_B = jnp.where(j_B > 0, jnp.take_along_axis(cum_BxN, jnp.maximum(j_B - 1, 0)[:, None], axis=1)[:, 0], 0.0)
  in_BxS = jnp.take_along_axis(p_BxNxS, j_B[:, None, None], axis=1)[:, 0]
  k_B = jnp.sum(before_B[:, None] + jnp.cumsum(in_BxS, axis=-1) <= target_B[:, None], axis=-1)
  last_B = block - 1 - jnp.argmax((in_BxS > 0)[:, ::-1], axis=-1)  # rounding past the block's end: its last token
  return (j_B * block + jnp.minimum(k_B, last_B)).astype(jnp.int32)


def _logprob_at(logits_BxV, idx_B):
  """log softmax(logits)[b, idx[b]] per row."""
  at_B = jnp.take_along_axis(logits_BxV, idx_B[:, None], axis=1)[:, 0]
  return at_B - jax.nn.logsumexp(logits_BxV, axis=-1)
