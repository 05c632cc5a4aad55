"""The programs of the continuous-batching engine, pure and jitted, for both KV layouts.

The scheduler (`scheduler.py`) owns every index: page tables or slot numbers, positions,
which rows are live; these functions only compute. Caches are donated.

  prefill_paged  R prompts right-padded to a bucket length, written into their pages; the
                 first token of each of up to D = batch_size sequences it starts (samples of
                 those prompts); then the copies of each prompt's partial last page into the
                 own page of each extra sample (copy-on-write of the one page they cannot share).
  prefill_slots  the same forward and first tokens; returns the prompts' keys/values
                 [L, R, K, P, E] for `insert_slots`.
  insert_slots   copies prompt row r's keys/values into each slot that starts one of its samples
                 (n samples of a prompt: n copies of the one prefilled row; possibly later, from
                 the same prefill output, for samples that waited for a slot).
  resize_slots   the slot buffers at another capacity (the scheduler's KV bucket).
  decode_round   up to `steps` decode steps for all B rows in one `lax.while_loop` (either
                 layout: `PagedKVCache` or `SlotKVCache`); a row stops at a stop id or its
                 token limit; each step's keys/values are written at the start of the next;
                 `eager`: end the round once a row stopped (work waits for its slot).

Randomness is per sample: generated token s of sample j of a request with seed x uses
`fold_in(key(x), s)`, folded once more with j when j > 0. Sample 0 thus draws exactly what
the lock-step engine draws, whatever the slot, round, layout or host.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from jaxpod.models.llama.model import Llama, PagedKVCache, SlotKVCache
from jaxpod.sample.config import SamplingParams
from jaxpod.sample.engine import NO_TOKEN, sample_tokens


def row_keys(seeds_B, samples_B, steps_B):
  """PRNG key per row: fold_in(key(seed), step), then fold_in(., sample) for samples > 0."""
  def one(seed, sample, step):
    k = jax.random.fold_in(jax.random.key(seed), step)
    data = jnp.where(sample > 0, jax.random.key_data(jax.random.fold_in(k, sample)), jax.random.key_data(k))
    return jax.random.wrap_key_data(data)
  return jax.vmap(one)(seeds_B, samples_B, steps_B)


def _prompts(model: Llama, tokens_RxP, lengths_R, seeds_R, row_D, sample_D, cache, sp: SamplingParams):
  """Forward of R prompts from position 0 (keys/values staged in the returned cache) and the first token and
  log-prob of each of the D sequences: sample sample_D[d] of prompt row row_D[d]."""
  r, p = tokens_RxP.shape
  positions_RxP = jnp.broadcast_to(jnp.arange(p), (r, p))
  out = model(tokens_RxP, positions_RxP, cache=cache, logits_at_B=lengths_R - 1, kv_len=0)
  with jax.named_scope("sampling"):
    keys = row_keys(seeds_R[row_D], sample_D, jnp.zeros_like(sample_D))
    first_D, logp_D = sample_tokens(out.logits[:, 0][row_D], keys, sp)
  return out.cache, positions_RxP, first_D, logp_D


def prefill_paged(graphdef, params, k_pool, v_pool, tokens_RxP, lengths_R, table_RxM, seeds_R, row_D, sample_D,
                  copy_src_D, copy_dst_D, *, sp: SamplingParams):
  """Pure: (k_pool, v_pool, first tokens [D], their log-probs [D]) after writing R prompts into their pages."""
  model: Llama = nnx.merge(graphdef, params)
  cache, positions_RxP, first_D, logp_D = _prompts(model, tokens_RxP, lengths_R, seeds_R, row_D, sample_D,
                                                   PagedKVCache(k_pool, v_pool, table_RxM), sp)
  committed = cache.write(cache.pending(positions_RxP))
  k, v = committed.k, committed.v
  k = k.at[:, copy_dst_D].set(k[:, copy_src_D])  # pad entries copy scratch onto scratch
  v = v.at[:, copy_dst_D].set(v[:, copy_src_D])
  return k, v, first_D, logp_D


def prefill_slots(graphdef, params, tokens_RxP, lengths_R, seeds_R, row_D, sample_D, *, sp: SamplingParams):
  """Pure: (keys [L, R, K, P, E], values [L, R, K, P, E], first tokens [D], their log-probs [D])."""
  model: Llama = nnx.merge(graphdef, params)
  cache, _, first_D, logp_D = _prompts(model, tokens_RxP, lengths_R, seeds_R, row_D, sample_D,
                                       SlotKVCache((), ()), sp)
  slot_layout = lambda staged: jnp.stack(staged).transpose(0, 1, 3, 2, 4)  # noqa: E731 - rows as the slots hold them
  return slot_layout(cache.staged_k), slot_layout(cache.staged_v), first_D, logp_D


def insert_slots(cache: SlotKVCache, k_LxRxKxPxE, v_LxRxKxPxE, row_D, slot_D, count) -> SlotKVCache:
  """Slot slot_D[d] gets prompt row row_D[d]'s keys/values at positions 0..P-1, for d < count: one in-place
  update of each layer's buffer per started sequence (n samples of a prompt: n copies of its one row)."""
  def body(d, bufs):
    put = lambda buf_BxKxSxE, x_RxKxPxE: jax.lax.dynamic_update_slice(  # noqa: E731
        buf_BxKxSxE, x_RxKxPxE[row_D[d]][None], (slot_D[d], 0, 0, 0))
    return tuple(map(put, bufs[0], k_LxRxKxPxE)), tuple(map(put, bufs[1], v_LxRxKxPxE))
  k, v = jax.lax.fori_loop(0, count, body, (cache.k, cache.v))
  return SlotKVCache(k, v)


def resize_slots(cache: SlotKVCache, *, capacity: int) -> SlotKVCache:
  """The buffers cut or zero-padded to `capacity` positions (the scheduler keeps every live position below it)."""
  def fit(buf_BxKxSxE):
    s = buf_BxKxSxE.shape[2]
    if capacity <= s:
      return buf_BxKxSxE[:, :, :capacity]
    return jnp.pad(buf_BxKxSxE, ((0, 0), (0, 0), (0, capacity - s), (0, 0)))
  return SlotKVCache(tuple(map(fit, cache.k)), tuple(map(fit, cache.v)))


def decode_round(graphdef, params, cache, tok_B, pos_B, gen_B, limit_B, seeds_B, samples_B, live_B, eager, *,
                 sp: SamplingParams, stop_ids: tuple[int, ...], steps: int, kv_len: int | None):
  """Pure: (cache, new tokens [B, steps], their log-probs [B, steps]); NO_TOKEN where a row was not live.

  Row b feeds tok_B[b] at position pos_B[b]; gen_B[b] tokens are already generated and
  the row stops after limit_B[b] or at a stop id; with `eager` (work waits for a slot) the
  round ends after the first step in which a row stopped. `cache`: a PagedKVCache (kv_len:
  the slots read per row) or a SlotKVCache (read whole: its capacity)."""
  model: Llama = nnx.merge(graphdef, params)
  b = tok_B.shape[0]
  stop = jnp.asarray(stop_ids or (NO_TOKEN,), jnp.int32)

  def cond(carry):
    i, live, ended = carry[0], carry[4], carry[9]
    return (i < steps) & jnp.any(live) & ~(eager & ended)

  def body(carry):
    # the previous step's keys/values are written first, so no read of the buffers follows the write
    i, tok, pos, gen, live, cache, pending, out_BxS, logp_BxS, _ = carry
    cache = cache.write(pending)
    o = model(tok[:, None], pos[:, None], cache=cache.for_rows(live), kv_len=kv_len)
    pending = o.cache.pending(pos[:, None])
    with jax.named_scope("sampling"):
      nxt, lp = sample_tokens(o.logits[:, 0], row_keys(seeds_B, samples_B, gen), sp)
    nxt = jnp.where(live, nxt, NO_TOKEN)
    out_BxS = jax.lax.dynamic_update_slice(out_BxS, nxt[:, None], (0, i))
    logp_BxS = jax.lax.dynamic_update_slice(logp_BxS, jnp.where(live, lp, 0.0)[:, None], (0, i))
    still = live & ~jnp.isin(nxt, stop) & (gen + 1 < limit_B)
    return i + 1, jnp.maximum(nxt, 0), pos + 1, gen + 1, still, cache, pending, out_BxS, logp_BxS, jnp.any(live & ~still)

  init = (jnp.int32(0), tok_B, pos_B, gen_B, live_B, cache, cache.nothing(b),
          jnp.full((b, steps), NO_TOKEN, jnp.int32), jnp.zeros((b, steps), jnp.float32), jnp.bool_(False))
  with jax.named_scope("decode_round"):
    carry = jax.lax.while_loop(cond, body, init)
  return carry[5].write(carry[6]), carry[7], carry[8]


WITH_GRAPH = ("prefill_paged", "prefill_slots", "decode")  # programs whose first argument is the (static) graphdef
_PROGRAMS = {"prefill_paged": (prefill_paged, (2, 3)), "prefill_slots": (prefill_slots, ()),
             "insert_slots": (insert_slots, (0,)), "resize_slots": (resize_slots, ()),  # a new shape: nothing to reuse
             "decode": (decode_round, (2,))}


@functools.lru_cache(maxsize=None)
def compiled(kind: str, checked: bool, **static):
  """One jitted program per kind and static setting; caches donated, params stay arguments."""
  from jaxpod import runtime
  fn, donate = _PROGRAMS[kind]
  fn = functools.partial(fn, **static)
  kw = {"donate_argnums": donate, **({"static_argnums": (0,)} if kind in WITH_GRAPH else {})}
  if checked:  # every host runs the same sequence of calls (global mode): the program check may compare them
    return runtime.jit(fn, name=f"sample.{kind}", **kw)
  return jax.jit(fn, **kw)
