"""The slots KV layout: slot b owns row b of per-layer [B, K, S, E] buffers, read in place.

  programs   extend_slots: continuations of kept sequences, each in its own slot (all B rows at once; a row that
             continues nothing writes nothing): the new tokens' forward over the slot's keys below them,
             their keys/values written there, the first token of the turn;
             prefill_slots: R prompts' forward and the first token of each sequence it starts,
             returning the prompts' keys/values [L, R, K, P, E]; insert_slots: copies prompt row
             r's keys/values into each slot that starts one of its samples (n samples of a prompt:
             n copies of the one prefilled row; possibly later, from the same prefill output, for
             samples that waited for a slot); resize_slots: the buffers at another capacity.
  SlotScheduler  (host side) a group is admitted when a slot is free: its prompt is prefilled once
             and copied into a free slot per sample; samples without one wait "parked" with the
             prefill's output (no second prefill) and take the next free slots before any new
             prompt. S follows the longest live row: the smallest bucket (`EngineConfig.kv_buckets`)
             above every position the round may write. A kept sequence holds its slot (`held`) until it is
             continued there or the slot is needed (then its KV is dropped).
  SlotRunner (device side) the buffers, slots split like the decode rows, at the scheduler's capacity.
"""
from __future__ import annotations

import collections
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxpod.models.llama.model import SLOT_AXES, Llama, SlotKVCache
from jaxpod.sample.config import EngineConfig, SamplingParams
from jaxpod.sample.runner import Runner
from jaxpod.sample.scheduler import Scheduler, Seq
from jaxpod.sample.steps import Program, chunk_forward, decode_round, prompts_forward
from jaxpod.sample.tokens import NO_TOKEN


def prefill_slots(graphdef, params, tokens_RxP, lengths_R, seeds_R, row_D, sample_D, *, sp: SamplingParams):
  """Pure: (keys [L, R, K, P, E], values [L, R, K, P, E], first tokens [D], their log-probs [D])."""
  model: Llama = nnx.merge(graphdef, params)
  cache, _, first_D, logp_D = prompts_forward(model, tokens_RxP, lengths_R, seeds_R, row_D, sample_D,
                                              SlotKVCache((), ()), sp)
  slot_layout = lambda staged: jnp.stack(staged).transpose(0, 1, 3, 2, 4)  # noqa: E731 - rows as the slots hold them
  return slot_layout(cache.staged_k), slot_layout(cache.staged_v), first_D, logp_D


def extend_slots(graphdef, params, cache: SlotKVCache, tokens_BxT, start_B, lengths_B, seeds_B, samples_B, write_B,
                 *, sp: SamplingParams):
  """Pure: (cache, first tokens [B], their log-probs [B]): row b's chunk fed at positions start_B[b].. over its
  slot's keys below them, its lengths_B[b] real keys/values written into slot write_B[b] (B: none)."""
  model: Llama = nnx.merge(graphdef, params)
  out, positions_BxT, first_B, logp_B = chunk_forward(model, tokens_BxT, start_B, lengths_B, seeds_B, samples_B,
                                                      SlotKVCache(cache.k, cache.v), sp, None)
  real_BxT = jnp.arange(tokens_BxT.shape[1])[None, :] < lengths_B[:, None]
  rows_BxT = jnp.where(real_BxT, write_B[:, None], cache.k[0].shape[0])  # padding and idle rows: dropped
  put = lambda buf, x_BxTxKxE: buf.at[rows_BxT, :, positions_BxT].set(x_BxTxKxE, mode="drop")  # noqa: E731
  return SlotKVCache(tuple(map(put, cache.k, out.staged_k)), tuple(map(put, cache.v, out.staged_v))), first_B, logp_B


def decode_slot_rows(graphdef, params, cache: SlotKVCache, tok_B, pos_B, gen_B, limit_B, seeds_B, samples_B, live_B,
                     eager, *, rows: int, shards: int, **decode):
  """Pure: `steps.decode_round` over the first `rows` slots of each of the `shards` row blocks (the scheduler keeps
  every live slot there), the other slots untouched: (cache, tokens [B, steps], log-probs [B, steps])."""
  b = tok_B.shape[0]
  args = (tok_B, pos_B, gen_B, limit_B, seeds_B, samples_B, live_B)
  if rows * shards == b:
    return decode_round(graphdef, params, cache, *args, eager, **decode)
  blocks = lambda x: x.reshape(shards, b // shards, *x.shape[1:])  # noqa: E731 - [shards, B / shards, ...]
  pick = lambda x: blocks(x)[:, :rows].reshape(shards * rows, *x.shape[1:])  # noqa: E731
  put = lambda x, y: blocks(x).at[:, :rows].set(y.reshape(shards, rows, *y.shape[1:])).reshape(x.shape)  # noqa: E731
  sub, out_RxS, logp_RxS = decode_round(graphdef, params, SlotKVCache(tuple(map(pick, cache.k)),
                                                                      tuple(map(pick, cache.v))),
                                        *map(pick, args), eager, **decode)
  steps = out_RxS.shape[1]
  return (SlotKVCache(tuple(map(put, cache.k, sub.k)), tuple(map(put, cache.v, sub.v))),
          put(jnp.full((b, steps), NO_TOKEN, jnp.int32), out_RxS), put(jnp.zeros((b, steps), jnp.float32), logp_RxS))


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


PREFILL = Program("prefill_slots", prefill_slots, (), True)
INSERT = Program("insert_slots", insert_slots, (0,), False)
RESIZE = Program("resize_slots", resize_slots, (), False)  # a new shape: nothing to reuse
EXTEND = Program("extend_slots", extend_slots, (2,), True)
DECODE_ROWS = Program("decode_slots", decode_slot_rows, (2,), True)


class SlotScheduler(Scheduler):
  """The slots layout (see module doc): a prompt prefilled once, copied into a free slot per sample; samples that
  find no free slot yet wait parked with the prefill's output and take the next free slots first."""

  def __init__(self, ec: EngineConfig, stop_ids: Sequence[int], device):
    super().__init__(ec, stop_ids, device)
    self.capacities: list[int] = []  # KV capacity per round
    self.row_counts: list[int] = []  # slots computed per round (over all row blocks)
    self.parked: list[tuple[Seq, object, int]] = []  # (sequence, its prefill's output, its prompt row there)
    self.parked_most = 0  # most sequences parked at once
    self.held: list[Seq | None] = [None] * ec.batch_size  # slot -> the kept sequence whose KV it holds

  @property
  def idle(self) -> bool:
    return super().idle and not self.parked

  def adopt(self, old: "SlotScheduler") -> None:
    super().adopt(old)
    self.held = old.held

  def _free(self) -> list[int]:
    """Free slots, lowest first within each row block and the blocks taken in turn: live slots stay in the
    smallest row class (`SlotRunner.row_classes`) their number allows."""
    block = self.device.block
    return sorted((i for i, s in enumerate(self.slots) if s is None and self.held[i] is None),
                  key=lambda i: (i % block, i // block))

  def _hold(self, seq: Seq) -> bool:
    i = next((i for i, s in enumerate(self.slots) if s is seq), None)  # finished at its prefill: not in a slot
    if i is not None:
      self.held[i] = seq
    return i is not None

  def _drop(self, seq: Seq) -> None:
    self.held[self.held.index(seq)] = None

  def _admit(self) -> None:
    ec = self.ec
    self._extend()
    want = len(self.parked) + sum(len(s) for _, s in self.waiting)
    while want > len(self._free()) and self._evict():  # kept sequences nobody claimed give their slots up
      pass
    self._unpark()
    while self.waiting and self._free():
      free, batch, taken = len(self._free()), [], 0
      while self.waiting and len(batch) < ec.prefill_rows and taken < free:  # each group starts now
        req, samples = self.waiting[0]
        if taken and len(samples) > ec.batch_size - taken:  # a prefill starts at most batch_size sequences:
          break                                              # this group goes whole into the next one
        self.waiting.popleft()
        take = min(len(samples), ec.batch_size)  # only a group larger than the slot count is split
        if take < len(samples):
          self.waiting.appendleft((req, samples[take:]))
        batch.append((req, samples[:take]))
        taken += take
      self._prefill(batch)

  def _extend(self) -> None:
    """Continue every waiting request whose kept sequence holds a slot, in that slot (one call for all)."""
    here = [(self.held.index(p), req, samples[0], p) for req, samples in self.waiting
            if (p := self._parent.get(req)) is not None and p in self.held]
    if not here:
      return
    mine = {req for _, req, _, _ in here}
    self.waiting = collections.deque(w for w in self.waiting if w[0] not in mine)
    b = self.ec.batch_size
    tokens, start, lengths, seeds, samples = self._chunk_rows(here, b)
    write = np.full((b,), b, np.int32)
    write[[i for i, *_ in here]] = [i for i, *_ in here]
    self._resize(max(self.device.capacity, int((start + lengths).max())), grow_only=True)
    first, logp = self.device.extend(tokens, start, lengths, seeds, samples, write)
    for i, req, j, p in here:
      del self._parent[req]
      self.held[i], self.slots[i] = None, self._continued(req, j, p, first[i], logp[i])
      if self._finished(self.slots[i]):
        self.slots[i] = None

  def _prefill(self, batch) -> None:
    tokens, lengths, seeds, row_D, sample_D = self._prompt_rows(batch)
    first_D, logp_D, staged = self.device.prefill(tokens, lengths, seeds, row_D, sample_D)
    self.parked += [(seq, staged, int(row_D[d])) for d, seq in enumerate(self._started(batch, first_D, logp_D))
                    if seq is not None]
    self._unpark()
    self.parked_most = max(self.parked_most, len(self.parked))

  def _unpark(self) -> None:
    """Parked sequences take free slots, oldest first: one insert per prefill output."""
    free = self._free()
    place, self.parked = self.parked[:len(free)], self.parked[len(free):]
    b, k = self.ec.batch_size, 0
    while k < len(place):
      staged = place[k][1]
      group = [x for x in place[k:] if x[1] is staged]
      row_D, slot_D = np.zeros((b,), np.int32), np.zeros((b,), np.int32)
      for d, (seq, _, row) in enumerate(group):
        row_D[d], slot_D[d] = row, free[k + d]
        self.slots[free[k + d]] = seq
      self._resize(max(self.device.capacity, self.device.prompt_len(staged)), grow_only=True)
      self.device.insert(staged, row_D, slot_D, len(group))
      k += len(group)

  def _prepare(self) -> None:
    last = max([self._last_pos(s) for s in self.slots if s is not None]  # and every kept position
               + [s.plen + len(s.out) - 2 for s in self.held if s is not None])
    self._resize(next(c for c in self.ec.kv_buckets() if c > last))
    self.capacities.append(self.device.capacity)

  def _resize(self, capacity: int, grow_only: bool = False) -> None:
    capacity = next(c for c in self.ec.kv_buckets() if c >= capacity)
    if capacity > self.device.capacity or (capacity < self.device.capacity and not grow_only):
      self.device.resize(capacity)

  def _device_decode(self, rows, last):
    del last  # the capacity set in _prepare covers it
    need = 1 + (np.flatnonzero(rows["live"]) % self.device.block).max(initial=0)  # the highest live slot of a block
    computed = next(r for r in self.device.row_classes() if r >= need)
    self.row_counts.append(computed * self.device.shards)
    return self.device.decode(rows["tok"], rows["pos"], rows["gen"], rows["limit"], rows["seeds"], rows["samples"],
                              rows["live"], bool(self.waiting or self.parked), rows=computed)


class SlotRunner(Runner):
  """Per-layer slot buffers at a bucketed capacity + compiled prefill/insert/resize/decode."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.cache = self._empty(self.ec.kv_buckets()[0])
    self.resizes = 0

  def _empty(self, capacity: int) -> SlotKVCache:
    cfg = self.cfg
    shape = (self.ec.batch_size, cfg.num_key_value_heads, capacity, cfg.head_dim_)
    zeros = [self._zeros(shape, SLOT_AXES, "kv_slots") for _ in range(2 * cfg.num_hidden_layers)]
    return SlotKVCache(tuple(zeros[0::2]), tuple(zeros[1::2]))

  @property
  def capacity(self) -> int:
    return self.cache.capacity

  def resize(self, capacity: int) -> None:
    """Buffers at `capacity` positions (cut or zero-padded; the scheduler keeps live positions below it), one
    bucket at a time (programs for neighbouring buckets only)."""
    caps = self.ec.kv_buckets()
    t = time.perf_counter()
    while capacity != self.capacity:
      i = caps.index(self.capacity)
      step = caps[i + 1] if capacity > self.capacity else caps[i - 1]
      self.cache = jax.block_until_ready(self._call(RESIZE, self.cache, capacity=step))
      self.resizes += 1
    self.device_s += time.perf_counter() - t

  def prefill(self, tokens_RxP, lengths_R, seeds_R, row_D, sample_D):
    """Prefill R prompts: (first tokens [D], their log-probs [D], the prompts' keys/values for `insert`)."""
    rows = [self._put(x) for x in (tokens_RxP, lengths_R, seeds_R)]
    t = time.perf_counter()
    k, v, first, logp = self._call(PREFILL, self.graphdef, self.params, *rows, self._whole(row_D),
                                   self._whole(sample_D), sp=self.sp)
    host = self._host(first, logp)
    self.device_s += time.perf_counter() - t
    return (*host, (k, v))

  @staticmethod
  def prompt_len(staged) -> int:
    """Positions a prefill output fills (its bucket): the capacity an `insert` of it needs."""
    return staged[0].shape[3]

  def extend(self, tokens_BxT, start_B, lengths_B, seeds_B, samples_B, write_B):
    """Continue kept sequences in their slots (row b: slot write_B[b], or none if B): (first tokens [B], log-probs)."""
    rows = [self._put(x) for x in (tokens_BxT, start_B, lengths_B, seeds_B, samples_B, write_B)]
    t = time.perf_counter()
    self.cache, first, logp = self._call(EXTEND, self.graphdef, self.params, self.cache, *rows, sp=self.sp)
    host = self._host(first, logp)
    self.device_s += time.perf_counter() - t
    return host

  def insert(self, staged, row_D, slot_D, count: int) -> None:
    """Slot slot_D[d] gets prompt row row_D[d] of a prefill output, for d < count."""
    if self.prompt_len(staged) > self.capacity:
      raise RuntimeError(f"slot capacity {self.capacity} < prefill length {self.prompt_len(staged)}: resize first")
    t = time.perf_counter()
    self.cache = self._call(INSERT, self.cache, *staged, self._whole(row_D), self._whole(slot_D),
                            self._whole(np.asarray(count, np.int32)))
    self.device_s += time.perf_counter() - t

  @property
  def block(self) -> int:
    """Slots per row block: the slots one data shard holds."""
    return self.ec.batch_size // self.shards

  def row_classes(self) -> tuple[int, ...]:
    """Slots per row block a decode round may compute, smallest first: the block's slots halved
    `ec.decode_row_classes` - 1 times (a round computes the smallest that covers its live slots)."""
    return tuple(sorted({max(1, self.block >> k) for k in range(self.ec.decode_row_classes)}))

  def decode(self, tok_B, pos_B, gen_B, limit_B, seeds_B, samples_B, live_B, eager: bool = False,
             rows: int | None = None):
    """(tokens [B, steps], their log-probs [B, steps]) on this host; rows read the whole current capacity; only
    the first `rows` slots of each row block compute (None: all; the others must not be live)."""
    self.cache, out = self._decode(self.cache, tok_B, pos_B, gen_B, limit_B, seeds_B, samples_B, live_B, eager,
                                   None, program=DECODE_ROWS, rows=rows or self.block, shards=self.shards)
    return out

  def warmup(self, keep: bool = False) -> int:
    """Compile every program a run may need: prefill per bucket, insert per (bucket, capacity), decode per
    (capacity, row class), resize between neighbouring capacities, and with `keep` (the sampler serves episodes)
    extend per (chunk bucket, capacity) a continuation can meet (all writes land in empty slots or nowhere); returns
    how many."""
    ec, r, b = self.ec, self.ec.prefill_rows, self.ec.batch_size
    z = np.zeros((b,), np.int32)
    caps, count = ec.kv_buckets(), len(ec.prefill_buckets())
    staged = {p: self.prefill(np.zeros((r, p), np.int32), np.ones((r,), np.int32), np.zeros((r,), np.uint32), z,
                              z)[2] for p in ec.prefill_buckets()}
    for cap in caps:
      self.resize(cap)
      for bucket in (p for p in ec.prefill_buckets() if p <= cap):
        self.insert(staged[bucket], z, z, 0)
        count += 1  # insert_slots at (bucket, cap)
      for rows in self.row_classes():
        self.decode(z, z, z, z, z.astype(np.uint32), z, z.astype(bool), rows=rows)
        count += 1
      for bucket in extend_buckets(ec, cap) if keep else ():
        self.extend(np.zeros((b, bucket), np.int32), z, np.ones((b,), np.int32), z.astype(np.uint32), z,
                    np.full((b,), b, np.int32))  # row b writes into slot B: none
        count += 1  # extend_slots at (bucket, cap)
    count += 2 * (len(caps) - 1)  # resize_slots between neighbours, both ways (compiled by the walk above and back)
    self.resize(caps[0])
    self.resizes = 0
    return count


def extend_buckets(ec: EngineConfig, capacity: int) -> list[int]:
  """Chunk buckets a continuation may be padded to at this slot capacity: the prefill buckets up to the first one
  that holds min(capacity, max_prompt_len) tokens (a chunk's tokens all land below the capacity)."""
  top = next(p for p in ec.prefill_buckets() if p >= min(capacity, ec.max_prompt_len))
  return [p for p in ec.prefill_buckets() if p <= top]
