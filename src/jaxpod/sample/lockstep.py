"""The lock-step engine: right-padded batched prefill, then decode in one `lax.while_loop`.

`Sampler` runs the continuous engine (`scheduler.py` over `slots.py` or `paged.py`); this one
stays as the reference the continuous engine is tested against (same tokens) and benchmarked
against. What both share (`Completion`, `sample_tokens`, `NO_TOKEN`) is in `tokens.py`.

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

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxpod.models.llama.model import KVCache, Llama
from jaxpod.runtime.sharding import constrain
from jaxpod.sample.config import EngineConfig, SamplingParams
from jaxpod.sample.tokens import NO_TOKEN, Completion, sample_tokens


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
