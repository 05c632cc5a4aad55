"""The continuous engine's device programs that both KV layouts share, and how every program is compiled.

The scheduler (`scheduler.py`) owns every index: page tables or slot numbers, positions,
which rows are live; the programs only compute. Caches are donated. Each layout module
(`slots.py`, `paged.py`) declares its own prefill (and, for slots, insert / resize) as a
`Program`; both decode with `decode_round` here:

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
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from jaxpod.models.llama.model import Llama
from jaxpod.sample.config import SamplingParams
from jaxpod.sample.tokens import NO_TOKEN, sample_tokens


class Program(NamedTuple):
  """A pure engine function and how it is jitted."""

  name: str  # shown in the program check and profiles as sample.<name>
  fn: Callable
  donate: tuple[int, ...]  # argument positions donated (the caches)
  with_graph: bool  # the first argument is the (static) graphdef


def row_keys(seeds_B, samples_B, steps_B):
  """PRNG key per row: fold_in(key(seed), step), then fold_in(., sample) for samples > 0."""
  def one(seed, sample, step):
    k = jax.random.fold_in(jax.random.key(seed), step)
    data = jnp.where(sample > 0, jax.random.key_data(jax.random.fold_in(k, sample)), jax.random.key_data(k))
    return jax.random.wrap_key_data(data)
  return jax.vmap(one)(seeds_B, samples_B, steps_B)

def prompts_forward(model: Llama, tokens_RxP, lengths_R, seeds_R, row_D, sample_D, cache, sp: SamplingParams):
  """Forward of R prompts from position 0 (keys/values staged in the returned cache) and the first token and
  log-prob of each of the D sequences: sample sample_D[d] of prompt row row_D[d]."""
  r, p = tokens_RxP.shape
  positions_RxP = jnp.broadcast_to(jnp.arange(p), (r, p))
  out = model(tokens_RxP, positions_RxP, cache=cache, logits_at_B=lengths_R - 1, kv_len=0)
  with jax.named_scope("sampling"):
    keys = row_keys(seeds_R[row_D], sample_D, jnp.zeros_like(sample_D))
    first_D, logp_D = sample_tokens(out.logits[:, 0][row_D], keys, sp)
  return out.cache, positions_RxP, first_D, logp_D

def chunk_forward(model: Llama, tokens_RxT, start_R, lengths_R, seeds_R, samples_R, cache, sp: SamplingParams,
                  kv_len: int | None):
  """Forward of R token chunks at positions start_R[r].. over each row's cached keys below start_R[r] (a
  kept sequence continued after new tokens: keys/values staged in the returned cache), and the next token and
  log-prob of each row (sample samples_R[r] of seed seeds_R[r], generated token 0: a turn's first)."""
  positions_RxT = start_R[:, None] + jnp.arange(tokens_RxT.shape[1])[None, :]
  out = model(tokens_RxT, positions_RxT, cache=cache, logits_at_B=lengths_R - 1, kv_len=kv_len)
  with jax.named_scope("sampling"):
    first_R, logp_R = sample_tokens(out.logits[:, 0], row_keys(seeds_R, samples_R, jnp.zeros_like(samples_R)), sp)
  return out.cache, positions_RxT, first_R, logp_R

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

DECODE = Program("decode", decode_round, (2,), True)


@functools.lru_cache(maxsize=None)
def compiled(program: Program, checked: bool, **static):
  """One jitted program per (program, static setting); caches donated, params stay arguments."""
  from jaxpod import runtime
  fn = functools.partial(program.fn, **static)
  kw = {"donate_argnums": program.donate, **({"static_argnums": (0,)} if program.with_graph else {})}
  if checked:  # every host runs the same sequence of calls (global mode): the program check may compare them
    return runtime.jit(fn, name=f"sample.{program.name}", **kw)
  return jax.jit(fn, **kw)
