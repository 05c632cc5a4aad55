"""The lock-step engine: right-padded batched prefill, then decode in one `lax.while_loop`.

`Sampler` now runs the continuous engine (`scheduler.py`, `steps.py`); this one stays as
the reference the continuous engine is tested against (same tokens) and benchmarked
against, and `Completion`, `sample_tokens` and `NO_TOKEN` are shared by both.

Slots of the static KV cache [L, B, K, S, E], S = max_prompt_len + max_new_tokens:
prompts sit right-padded at slots 0..P-1 (row b valid below `lengths[b]`), decode step s
writes every row at slot P + s - 1 while RoPE uses the row's true position lengths[b] + s - 1.
So each write is one dynamic_update_slice at a scalar index, and outputs equal those of an
unpadded run of each prompt alone.

Randomness is per request: row b at step s uses `fold_in(key(seed_b), s)`, so a prompt's
completion does not depend on its chunk, its row, the mode or the host count.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxpod.models.llama.model import KVCache, Llama
from jaxpod.runtime.sharding import constrain
from jaxpod.sample.config import EngineConfig, SamplingParams

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


def sample_tokens(logits_BxV, keys_B, sp: SamplingParams):
  """Next token per row and its log-probability (float32): greedy, or temperature / top-k / top-p with per-row keys.

  The log-prob is that of the token under the distribution it was drawn from:
    temperature T > 0: log softmax(logits / T) at the token, after the top-k and top-p filters
                       (filtered tokens have probability 0, the rest are renormalised);
    greedy (T = 0):    log_softmax(logits) at the argmax (temperature 1, unfiltered): the model's own
                       probability of the chosen token.
  A draw takes one uniform number per row (inverse CDF, `categorical`).
  Returns (tokens [B] int32, logprobs [B] float32)."""
  logits = logits_BxV.astype(jnp.float32)
  if sp.temperature == 0:
    tok_B = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return tok_B, jnp.max(logits, axis=-1) - jax.nn.logsumexp(logits, axis=-1)  # the argmax's logit is the max
  logits = logits / sp.temperature
  k = sp.top_k if sp.top_k > 0 else (logits.shape[-1] if sp.top_p < 1 else 0)
  if k == 0:
    tok_B = categorical(keys_B, logits)
    return tok_B, _logprob_at(logits, tok_B)
  vals_BxK, idx_BxK = jax.lax.top_k(logits, k)  # sorted, most likely first
  if sp.top_p < 1:
    probs = jax.nn.softmax(vals_BxK, axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs  # mass strictly above each candidate
    vals_BxK = jnp.where(before < sp.top_p, vals_BxK, -jnp.inf)  # the first one always stays
  choice_B = categorical(keys_B, vals_BxK)
  tok_B = jnp.take_along_axis(idx_BxK, choice_B[:, None], axis=1)[:, 0].astype(jnp.int32)
  return tok_B, _logprob_at(vals_BxK, choice_B)


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


def _keys(seeds_B, step):
  return jax.vmap(lambda s: jax.random.fold_in(jax.random.key(s), step))(seeds_B)


def generate(graphdef, params, tokens_BxP, lengths_B, seeds_B, *, ec: EngineConfig, sp: SamplingParams,
             stop_ids: tuple[int, ...]):
  """Pure: (new tokens [B, N] int32, their log-probs [B, N] float32); NO_TOKEN (log-prob 0) after a row stops.

  The stop token is kept."""
  model: Llama = nnx.merge(graphdef, params)
  b, p = tokens_BxP.shape
  n, s = ec.max_new_tokens, ec.cache_len
  stop = jnp.asarray(stop_ids or (NO_TOKEN,), jnp.int32)
  cache = KVCache.zeros(model.cfg, b, s)
  kv_mask_BxS = constrain(jnp.arange(s)[None, :] < lengths_B[:, None], ("batch", "cache_seq"))
  with jax.named_scope("prefill"):
    out = model(tokens_BxP, jnp.broadcast_to(jnp.arange(p), (b, p)), kv_mask_BxS=kv_mask_BxS, cache=cache,
                cache_index=0, logits_at_B=lengths_B - 1, kv_len=p)
  with jax.named_scope("sampling"):
    tok_B, logp_B = sample_tokens(out.logits[:, 0], _keys(seeds_B, 0), sp)
  done_B = jnp.isin(tok_B, stop)
  new_BxN = jnp.full((b, n), NO_TOKEN, jnp.int32).at[:, 0].set(tok_B)
  logp_BxN = jnp.zeros((b, n), jnp.float32).at[:, 0].set(logp_B)

  def cond(carry):
    step, _, _, _, done_B, _, _ = carry
    return (step < n) & ~jnp.all(done_B)

  def body(carry):
    step, tok_B, cache, kv_mask_BxS, done_B, new_BxN, logp_BxN = carry
    slot = p + step - 1
    tok_B = jnp.maximum(tok_B, 0)  # stopped rows keep running on a dummy token; their output is dropped
    kv_mask_BxS = jax.lax.dynamic_update_slice(kv_mask_BxS, jnp.ones((b, 1), bool), (0, slot))
    o = model(tok_B[:, None], (lengths_B + step - 1)[:, None], kv_mask_BxS=kv_mask_BxS, cache=cache,
              cache_index=slot)
    with jax.named_scope("sampling"):
      nxt_B, lp_B = sample_tokens(o.logits[:, 0], _keys(seeds_B, step), sp)
    nxt_B = jnp.where(done_B, NO_TOKEN, nxt_B)
    new_BxN = jax.lax.dynamic_update_slice(new_BxN, nxt_B[:, None], (0, step))
    logp_BxN = jax.lax.dynamic_update_slice(logp_BxN, jnp.where(done_B, 0.0, lp_B)[:, None], (0, step))
    return step + 1, nxt_B, o.cache, kv_mask_BxS, done_B | jnp.isin(nxt_B, stop), new_BxN, logp_BxN

  with jax.named_scope("decode"):
    carry = jax.lax.while_loop(cond, body, (jnp.int32(1), tok_B, out.cache, kv_mask_BxS, done_B, new_BxN,
                                            logp_BxN))
  return carry[-2], carry[-1]


def prefill_only(graphdef, params, tokens_BxP, lengths_B, *, ec: EngineConfig):
  """Prefill alone (first-token logits); used by the benchmark to time prefill."""
  model: Llama = nnx.merge(graphdef, params)
  b, p = tokens_BxP.shape
  cache = KVCache.zeros(model.cfg, b, ec.cache_len)
  kv_mask_BxS = jnp.arange(ec.cache_len)[None, :] < lengths_B[:, None]
  return model(tokens_BxP, jnp.broadcast_to(jnp.arange(p), (b, p)), kv_mask_BxS=kv_mask_BxS, cache=cache,
               cache_index=0, logits_at_B=lengths_B - 1, kv_len=p).logits


def completion(new_N: np.ndarray, logp_N: np.ndarray, stop_ids, version: int, request: int,
               sample: int = 0) -> Completion:
  """The `Completion` of one row of the lock-step engine's output (every token made by `version`)."""
  ids = [int(t) for t in new_N if t != NO_TOKEN]
  reason = "stop" if ids and ids[-1] in stop_ids else "length"
  return Completion(tuple(ids), reason, tuple(float(x) for x in logp_N[:len(ids)]), (version,) * len(ids),
                    request, sample)


@functools.lru_cache(maxsize=None)
def compiled_generate(ec: EngineConfig, sp: SamplingParams, stop_ids: tuple[int, ...]):
  """One jitted generate per (engine config, sampling params, stop ids); params stay arguments."""
  from jaxpod import runtime
  return runtime.jit(functools.partial(generate, ec=ec, sp=sp, stop_ids=stop_ids), name="sample.generate",
                     static_argnums=(0,))
