"""The two programs of the continuous-batching engine, pure and jitted: paged prefill and a decode round.

Both read and write the paged KV pools (`PagedKVCache`, page 0 scratch) and are donated
them. The scheduler (`scheduler.py`) owns every index: page tables, positions, which rows
are live; these functions only compute.

  prefill       R prompts right-padded to a bucket length, written into their pages; the
                first token of each of up to D = batch_size sequences it starts (samples of
                those prompts); then the copies of the prompt's partial last page into each
                extra sample's own page.
  decode_round  up to `steps` decode steps for all B slots in one `lax.while_loop`; a row
                stops at a stop id or at its token limit (later steps write to scratch).

Randomness is per sample: generated token s of sample j of a request with seed x uses
`fold_in(key(x), s)`, folded once more with j when j > 0. Sample 0 thus draws exactly what
the lock-step engine draws, whatever the slot, round or host.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from jaxpod.models.llama.model import Llama, PagedKVCache
from jaxpod.sample.config import SamplingParams
from jaxpod.sample.engine import NO_TOKEN, sample_tokens


def row_keys(seeds_B, samples_B, steps_B):
  """PRNG key per row: fold_in(key(seed), step), then fold_in(., sample) for samples > 0."""
  def one(seed, sample, step):
    k = jax.random.fold_in(jax.random.key(seed), step)
    data = jnp.where(sample > 0, jax.random.key_data(jax.random.fold_in(k, sample)), jax.random.key_data(k))
    return jax.random.wrap_key_data(data)
  return jax.vmap(one)(seeds_B, samples_B, steps_B)


def prefill(graphdef, params, k_pool, v_pool, tokens_RxP, lengths_R, table_RxM, seeds_R, row_D, sample_D,
            copy_src_D, copy_dst_D, *, sp: SamplingParams):
  """Pure: (k_pool, v_pool, first tokens [D], their log-probs [D]) after writing R prompts into their pages.

  Sequence d starts as sample sample_D[d] of prompt row row_D[d] (unused entries: anything; ignored)."""
  model: Llama = nnx.merge(graphdef, params)
  r, p = tokens_RxP.shape
  positions_RxP = jnp.broadcast_to(jnp.arange(p), (r, p))
  cache = PagedKVCache(k_pool, v_pool, table_RxM)  # prompts start at position 0: no earlier slot to read
  out = model(tokens_RxP, positions_RxP, cache=cache, logits_at_B=lengths_R - 1, kv_len=0)
  with jax.named_scope("sampling"):
    keys = row_keys(seeds_R[row_D], sample_D, jnp.zeros_like(sample_D))
    first_D, logp_D = sample_tokens(out.logits[:, 0][row_D], keys, sp)
  committed = out.cache.commit(positions_RxP)
  k, v = committed.k, committed.v
  k = k.at[:, copy_dst_D].set(k[:, copy_src_D])  # pad entries copy scratch onto scratch
  v = v.at[:, copy_dst_D].set(v[:, copy_src_D])
  return k, v, first_D, logp_D


def decode_round(graphdef, params, k_pool, v_pool, table_BxM, tok_B, pos_B, gen_B, limit_B, seeds_B, samples_B,
                 live_B, *, sp: SamplingParams, stop_ids: tuple[int, ...], steps: int, kv_len: int):
  """Pure: (k_pool, v_pool, new tokens [B, steps], their log-probs [B, steps]); NO_TOKEN where a row was not live.

  Row b feeds tok_B[b] at position pos_B[b]; gen_B[b] tokens are already generated and
  the row stops after limit_B[b] or at a stop id."""
  model: Llama = nnx.merge(graphdef, params)
  b = tok_B.shape[0]
  stop = jnp.asarray(stop_ids or (NO_TOKEN,), jnp.int32)

  def cond(carry):
    i, live = carry[0], carry[4]
    return (i < steps) & jnp.any(live)

  def body(carry):
    # the previous step's keys/values are written first, so no read of the pools follows the write
    i, tok, pos, gen, live, k, v, pending, out_BxS, logp_BxS = carry
    k, v = PagedKVCache.write(k, v, *pending)
    cache = PagedKVCache(k, v, jnp.where(live[:, None], table_BxM, 0))  # finished rows write to scratch
    o = model(tok[:, None], pos[:, None], cache=cache, kv_len=kv_len)
    pending = (*cache.slots(pos[:, None]), *o.cache.staged())
    with jax.named_scope("sampling"):
      nxt, lp = sample_tokens(o.logits[:, 0], row_keys(seeds_B, samples_B, gen), sp)
    nxt = jnp.where(live, nxt, NO_TOKEN)
    out_BxS = jax.lax.dynamic_update_slice(out_BxS, nxt[:, None], (0, i))
    logp_BxS = jax.lax.dynamic_update_slice(logp_BxS, jnp.where(live, lp, 0.0)[:, None], (0, i))
    live = live & ~jnp.isin(nxt, stop) & (gen + 1 < limit_B)
    return i + 1, jnp.maximum(nxt, 0), pos + 1, gen + 1, live, k, v, pending, out_BxS, logp_BxS

  l, _, _, kh, e = k_pool.shape
  nothing = (jnp.zeros((b, 1), jnp.int32), jnp.zeros((b, 1), jnp.int32),  # scratch page 0
             jnp.zeros((l, b, 1, kh, e), k_pool.dtype), jnp.zeros((l, b, 1, kh, e), v_pool.dtype))
  init = (jnp.int32(0), tok_B, pos_B, gen_B, live_B, k_pool, v_pool, nothing,
          jnp.full((b, steps), NO_TOKEN, jnp.int32), jnp.zeros((b, steps), jnp.float32))
  with jax.named_scope("decode_round"):
    carry = jax.lax.while_loop(cond, body, init)
  k, v = PagedKVCache.write(carry[5], carry[6], *carry[7])
  return k, v, carry[8], carry[9]


@functools.lru_cache(maxsize=None)
def compiled(kind: str, checked: bool, **static):
  """One jitted prefill or decode_round per static setting; pools donated, params stay arguments."""
  from jaxpod import runtime
  fn = functools.partial({"prefill": prefill, "decode": decode_round}[kind], **static)
  if checked:  # every host runs the same sequence of calls (global mode): the program check may compare them
    return runtime.jit(fn, name=f"sample.{kind}", static_argnums=(0,), donate_argnums=(2, 3))
  return jax.jit(fn, static_argnums=(0,), donate_argnums=(2, 3))
