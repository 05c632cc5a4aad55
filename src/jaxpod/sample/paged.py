"""The paged KV layout: pages of `page_size` tokens from a shared pool, a page table per sequence.

Page 0 is the scratch page (never handed out): unused page-table entries point at it. A
prompt's full pages are shared by its n samples (one reference each); a page returns to
the free list when its last reference is dropped.

  prefill_paged   (program) R prompts right-padded to a bucket length, written into their pages; the
                  first token of each of up to D = batch_size sequences it starts (samples of those
                  prompts); then the copies of each prompt's partial last page into the own page of
                  each extra sample (copy-on-write of the one page they cannot share).
  extend_paged    (program) continuations of kept sequences: each row's new tokens at positions start.. over its
                  pages below them (read as a decode reads), their keys/values written into the row's pages
                  (padding into scratch), the first token of the turn.
  PagePool        a free list and a reference count per page, per data shard.
  PagedScheduler  (host side) admission, page growth, preemption when a shard's pool runs short.
  PagedRunner     (device side) page pools [L, N, P, page_size, K, E]: one pool of P pages per data shard
                  (N = the mesh's data x fsdp), each on its shard's devices and sharded like the model's
                  kv heads. Decode slots and prefill rows split in N blocks like the batch, and a row
                  uses pages of its own shard only (its sequences' prompt pages, shared samples and
                  copies stay there), so no device holds the pages of another shard's rows.
"""
from __future__ import annotations

import collections
import time
from typing import Sequence

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxpod.models.llama.model import PAGE_AXES, Llama, PagedKVCache
from jaxpod.sample.config import EngineConfig, SamplingParams
from jaxpod.sample.runner import Runner
from jaxpod.sample.scheduler import Scheduler, Seq
from jaxpod.sample.steps import Program, chunk_forward, prompts_forward


def prefill_paged(graphdef, params, k_pool, v_pool, tokens_RxP, lengths_R, table_RxM, seeds_R, row_D, sample_D,
                  copy_src_D, copy_dst_D, *, sp: SamplingParams):
  """Pure: (k_pool, v_pool, first tokens [D], their log-probs [D]) after writing R prompts into their pages."""
  model: Llama = nnx.merge(graphdef, params)
  cache, positions_RxP, first_D, logp_D = prompts_forward(model, tokens_RxP, lengths_R, seeds_R, row_D, sample_D,
                                                          PagedKVCache(k_pool, v_pool, table_RxM), sp)
  committed = cache.write(cache.pending(positions_RxP)).copy_pages(copy_src_D, copy_dst_D)
  return committed.k, committed.v, first_D, logp_D


def extend_paged(graphdef, params, k_pool, v_pool, tokens_RxT, start_R, lengths_R, table_RxM, seeds_R, samples_R, *,
                 sp: SamplingParams, kv_len: int):
  """Pure: (k_pool, v_pool, first tokens [R], their log-probs [R]) after R kept sequences' new tokens."""
  model: Llama = nnx.merge(graphdef, params)
  cache, positions_RxT, first_R, logp_R = chunk_forward(model, tokens_RxT, start_R, lengths_R, seeds_R, samples_R,
                                                        PagedKVCache(k_pool, v_pool, table_RxM), sp, kv_len)
  page_RxT, off_RxT, k, v = cache.pending(positions_RxT)
  real_RxT = jnp.arange(tokens_RxT.shape[1])[None, :] < lengths_R[:, None]
  committed = cache.write((jnp.where(real_RxT, page_RxT, 0), off_RxT, k, v))  # padding: into scratch
  return committed.k, committed.v, first_R, logp_R


PREFILL = Program("prefill_paged", prefill_paged, (2, 3), True)
EXTEND = Program("extend_paged", extend_paged, (2, 3), True)


class PagePool:
  """Free list + reference counts over pages 1..num_pages-1 of each of `shards` pools (page ids are per shard)."""

  def __init__(self, num_pages: int, shards: int = 1):
    self.num_pages, self.shards = num_pages, shards
    self._free = [list(range(num_pages - 1, 0, -1)) for _ in range(shards)]  # pop() hands out low page ids first
    self._refs = [[0] * num_pages for _ in range(shards)]
    self.peak_used = 0  # most pages held at once, all shards together

  @property
  def free(self) -> int:
    """Free pages, all shards together."""
    return sum(map(len, self._free))

  @property
  def used(self) -> int:
    return self.shards * (self.num_pages - 1) - self.free

  def free_in(self, shard: int) -> int:
    return len(self._free[shard])

  def alloc(self, count: int, shard: int = 0) -> list[int]:
    """`count` fresh pages of `shard` with one reference each; raises if fewer are free (callers check `free_in`)."""
    free = self._free[shard]
    if count > len(free):
      raise RuntimeError(f"page pool: {count} pages asked in shard {shard}, {len(free)} free")
    got = [free.pop() for _ in range(count)]
    for p in got:
      self._refs[shard][p] = 1
    self.peak_used = max(self.peak_used, self.used)
    return got

  def share(self, pages: list[int], shard: int = 0) -> list[int]:
    """One more reference to each page (a sample sharing its prompt's full pages)."""
    for p in pages:
      self._refs[shard][p] += 1
    return list(pages)

  def release(self, pages: list[int], shard: int = 0) -> None:
    """Drop one reference to each page; pages nobody holds go back to their shard's free list."""
    refs = self._refs[shard]
    for p in pages:
      refs[p] -= 1
      if refs[p] == 0:
        self._free[shard].append(p)
      elif refs[p] < 0:
        raise RuntimeError(f"page pool: page {p} of shard {shard} released more often than taken")


def decode_page_buckets(max_pages: int) -> list[int]:
  """KV lengths (in pages) the paged decode program is compiled for: powers of two, then the table width."""
  out, p = [], 1
  while p < max_pages:
    out.append(p)
    p *= 2
  return out + [max_pages]


class PagedScheduler(Scheduler):
  """The paged layout (see `scheduler.py`):

  1. admit: while slots are free (not running, not already waiting in `ready`), take waiting
     requests in order, up to `prefill_rows` per call and `batch_size` samples, give each
     prompt its pages (full pages shared by its samples, the partial last page copied per
     extra sample: copy-on-write) and prefill; every sample becomes a ready sequence; ready
     sequences take free slots (a slot is a page-table row: no device work);
  2. prepare: each running sequence gets the pages its next round needs; if the pool is short, the
     newest sequences are preempted (pages dropped, the sample goes back to the front of
     the queue and restarts; per-sample seeds make it draw the same tokens).

  With N data shards (`device.shards`), slot i and prefill row r belong to shard i // (B/N) and
  r // (R/N); a prompt goes to the shard with the most room whose rows, slots (B/N samples per
  prefill) and pages fit it, and its samples' pages, prefill row and slots stay in that shard;
  preemption frees pages in the shard that lacks them.
  """

  def __init__(self, ec: EngineConfig, stop_ids: Sequence[int], device):
    super().__init__(ec, stop_ids, device)
    self.shards = getattr(device, "shards", 1)
    self.pool = PagePool(ec.shard_pages(self.shards), self.shards)
    self._slot_block, self._row_block = ec.batch_size // self.shards, ec.prefill_rows // self.shards

  def adopt(self, old: "PagedScheduler") -> None:
    super().adopt(old)
    self.pool = old.pool
    self.pool.peak_used = self.pool.used

  def _hold(self, seq: Seq) -> bool:
    return True  # its pages stay taken

  # -- admission -------------------------------------------------------------------------
  def _prompt_pages(self, plen: int, samples: int) -> int:
    partial = plen % self.ec.page_size != 0
    return -(-plen // self.ec.page_size) + (samples - 1 if partial else 0)

  def _admit(self) -> None:
    self._extend_waiting()
    self._prefill_waiting()
    for i, s in enumerate(self.slots):  # ready sequences take free slots of their shard, oldest first
      if s is None:
        j = next((j for j, r in enumerate(self.ready) if r.shard == i // self._slot_block), None)
        if j is not None:
          self.slots[i] = self.ready.pop(j)

  def _room(self, shard: int) -> int:
    """Free slots of a shard that its ready sequences do not already wait for."""
    lo = shard * self._slot_block
    return (sum(s is None for s in self.slots[lo:lo + self._slot_block])
            - sum(r.shard == shard for r in self.ready))

  def _prefill_waiting(self) -> None:
    n, bl, rl = self.shards, self._slot_block, self._row_block
    while self.waiting and any(self._room(h) > 0 for h in range(n)):
      batch, started, rows, reserve = [], [0] * n, [0] * n, [0] * n
      for s in self.slots:  # running rows grow first
        if s is not None:
          reserve[s.shard] += self._need(s)
      while self.waiting and len(batch) < self.ec.prefill_rows:
        req, samples = self.waiting[0]
        if req in self._parent:  # a continuation waiting for room or pages: it goes first
          break
        plen, choice = len(self._ids[req]), None
        for h in sorted(range(n), key=lambda h: (started[h] - self._room(h), h)):
          if rows[h] >= rl or started[h] >= bl or (started[h] and len(samples) > bl - started[h]):
            continue  # at most B/N sequences per shard and prefill: this group goes whole into another one
          free, most = self.pool.free_in(h) - reserve[h], min(len(samples), bl)
          fit = max((k for k in range(1, most + 1) if self._prompt_pages(plen, k) <= free), default=0)
          while not fit and self._prompt_pages(plen, 1) > free and self._evict(h):  # kept KV nobody claimed
            free = self.pool.free_in(h) - reserve[h]
            fit = max((k for k in range(1, most + 1) if self._prompt_pages(plen, k) <= free), default=0)
          if fit:
            choice = (h, fit)
            break
        if choice is None:
          break
        (h, fit), _ = choice, self.waiting.popleft()
        if fit < len(samples):  # the rest waits for pages
          self.waiting.appendleft((req, samples[fit:]))
        batch.append((req, samples[:fit], self._take_prompt_pages(plen, fit, h), h, h * rl + rows[h]))
        rows[h], started[h] = rows[h] + 1, started[h] + fit
      if not batch:
        return
      self._prefill(batch)

  def _busy(self, shard: int) -> bool:
    return any(s is not None and s.shard == shard for s in self.slots) or any(r.shard == shard for r in self.ready)

  def _extend_waiting(self) -> None:
    """Continue waiting requests from their kept sequences (rows, slots and pages of the kept one's shard), in one
    call; a continuation that finds no pages waits while its shard has work, else it is prefilled whole."""
    rl, ps = self._row_block, self.ec.page_size
    rows, items, rest = [0] * self.shards, [], collections.deque()
    for req, samples in self.waiting:
      p = self._parent.get(req)
      h = p.shard if p is not None else 0
      if p is None or rows[h] >= min(rl, self._room(h)):
        rest.append((req, samples))
        continue
      need = (len(self._ids[req]) - 1) // ps + 1 - len(p.pages)
      while need > self.pool.free_in(h) and self._evict(h):
        pass
      if need > self.pool.free_in(h):
        if not self._busy(h):
          self._unclaim(req)
        rest.append((req, samples))
        continue
      p.pages = p.pages + self.pool.alloc(max(need, 0), h)
      items.append((h * rl + rows[h], req, samples[0], p))
      rows[h] += 1
    self.waiting = rest
    if not items:
      return
    tokens, start, lengths, seeds, samples = self._chunk_rows(items, self.ec.prefill_rows)
    table = np.zeros((self.ec.prefill_rows, self.ec.pages_per_seq), np.int32)
    for row, _, _, p in items:
      table[row, :len(p.pages)] = p.pages
    kv_len = ps * next(k for k in decode_page_buckets(self.ec.pages_per_seq) if k * ps >= start.max())
    first, logp = self.device.extend(tokens, start, lengths, table, seeds, samples, kv_len)
    for row, req, j, p in items:
      del self._parent[req]
      seq = self._continued(req, j, p, first[row], logp[row])
      if not self._finished(seq):
        self.ready.append(seq)

  def _take_prompt_pages(self, plen: int, k: int, shard: int) -> list[list[int]]:
    """Page rows of k samples of one prompt in one shard: shared full pages, own partial page (a copy for j > 0)."""
    ps = self.ec.page_size
    full, partial = plen // ps, plen % ps != 0
    first = self.pool.alloc(full + partial, shard)
    rows = [first]
    for _ in range(k - 1):
      rows.append(self.pool.share(first[:full], shard) + (self.pool.alloc(1, shard) if partial else []))
    return rows

  def _prefill(self, batch) -> None:
    ec, d = self.ec, self.ec.batch_size
    tokens, lengths, seeds, row_D, sample_D = self._prompt_rows(batch, [b[4] for b in batch])
    table = np.zeros((ec.prefill_rows, ec.pages_per_seq), np.int32)
    src_D, dst_D = np.zeros((d,), np.int32), np.zeros((d,), np.int32)  # partial-page copies (pad: scratch to scratch)
    copies = [0] * self.shards  # shard h's copies at h * B/N, h * B/N + 1, ...
    for req, _, rows, h, row in batch:
      table[row, :len(rows[0])] = rows[0]
      if len(self._ids[req]) % ec.page_size:
        for own in rows[1:]:
          at = h * self._slot_block + copies[h]
          src_D[at], dst_D[at] = rows[0][-1], own[-1]
          copies[h] += 1
    first_D, logp_D = self.device.prefill(tokens, lengths, table, seeds, row_D, sample_D, src_D, dst_D)
    self.ready += [s for s in self._started(batch, first_D, logp_D) if s is not None]

  # -- slots and pages for the next round, preemption ----------------------------------------
  def _prepare(self) -> None:
    self._grow()

  def _need(self, seq: Seq) -> int:
    """Pages this sequence lacks for its next round."""
    return max(0, self._last_pos(seq) // self.ec.page_size + 1 - len(seq.pages))

  def _grow(self) -> None:
    order = sorted((i for i, s in enumerate(self.slots) if s is not None), key=lambda i: -len(self.slots[i].out))
    for i in order:  # oldest (most tokens) first: they are the last to be preempted
      seq = self.slots[i]
      if seq is None:
        continue
      need = self._need(seq)
      while need > self.pool.free_in(seq.shard) and (self._evict(seq.shard) or self._unclaim_newest(seq.shard)
                                                      or self._preempt(keep=seq)):
        pass
      if need > 0:
        seq.pages += self.pool.alloc(need, seq.shard)

  def _unclaim_newest(self, shard: int) -> bool:
    """Drop the kept KV of the newest waiting continuation in `shard` (it is prefilled whole); False if none."""
    req = next((r for r in reversed(list(self._parent)) if self._parent[r].shard == shard), None)
    if req is not None:
      self._unclaim(req)
    return req is not None

  def _preempt(self, keep: Seq) -> bool:
    """Free the pages of the newest ready or running sequence of `keep`'s shard other than `keep`; False if none."""
    mine = [j for j, r in enumerate(self.ready) if r.shard == keep.shard]
    if mine:
      victim = self.ready.pop(mine[-1])
    else:
      live = [i for i, s in enumerate(self.slots) if s is not None and s is not keep and s.shard == keep.shard]
      if not live:
        return False
      i = min(live, key=lambda i: len(self.slots[i].out))
      victim, self.slots[i] = self.slots[i], None
    self.pool.release(victim.pages, victim.shard)
    self.waiting.appendleft((victim.req, (victim.sample,)))
    self.preemptions += 1
    return True

  def _release(self, seq: Seq) -> None:
    self.pool.release(seq.pages, seq.shard)

  # -- decode ------------------------------------------------------------------------------
  def _device_decode(self, rows, last):
    ec, m = self.ec, self.ec.pages_per_seq
    table = np.zeros((ec.batch_size, m), np.int32)
    for i, s in enumerate(self.slots):
      if s is not None:
        table[i, :len(s.pages)] = s.pages
    pages = next(p for p in decode_page_buckets(m) if p * ec.page_size > last)  # few programs: power-of-two KV
    return self.device.decode(table, rows["tok"], rows["pos"], rows["gen"], rows["limit"], rows["seeds"],
                              rows["samples"], rows["live"], pages * ec.page_size, bool(self.waiting or self.ready))


class PagedRunner(Runner):
  """A page pool per data shard + compiled prefill/decode."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    cfg, ec = self.cfg, self.ec
    shape = (cfg.num_hidden_layers, self.shards, ec.shard_pages(self.shards), ec.page_size, cfg.num_key_value_heads,
             cfg.head_dim_)
    self.k, self.v = self._zeros(shape, PAGE_AXES, "kv_pool"), self._zeros(shape, PAGE_AXES, "kv_pool")

  def prefill(self, tokens_RxP, lengths_R, table_RxM, seeds_R, row_D, sample_D, copy_src_D, copy_dst_D):
    """(first tokens [D], their log-probs [D]) on this host."""
    rows = [self._put(x) for x in (tokens_RxP, lengths_R, table_RxM, seeds_R)]
    rest = [self._whole(x) for x in (row_D, sample_D, copy_src_D, copy_dst_D)]
    t = time.perf_counter()
    self.k, self.v, first, logp = self._call(PREFILL, self.graphdef, self.params, self.k, self.v, *rows,
                                             *rest, sp=self.sp)
    host = self._host(first, logp)
    self.device_s += time.perf_counter() - t
    return host

  def extend(self, tokens_RxT, start_R, lengths_R, table_RxM, seeds_R, samples_R, kv_len: int):
    """Continue kept sequences (row r: its new tokens from start_R[r], its pages in table_RxM[r]): (first tokens
    [R], their log-probs [R]) on this host; rows read kv_len slots of their pages."""
    rows = [self._put(x) for x in (tokens_RxT, start_R, lengths_R, table_RxM, seeds_R, samples_R)]
    t = time.perf_counter()
    self.k, self.v, first, logp = self._call(EXTEND, self.graphdef, self.params, self.k, self.v, *rows, sp=self.sp,
                                             kv_len=kv_len)
    host = self._host(first, logp)
    self.device_s += time.perf_counter() - t
    return host

  def decode(self, table_BxM, tok_B, pos_B, gen_B, limit_B, seeds_B, samples_B, live_B, kv_len: int,
             eager: bool = False):
    """(tokens [B, steps], their log-probs [B, steps]) on this host; rows read kv_len slots of their pages."""
    cache = PagedKVCache(self.k, self.v, self._put(table_BxM))
    cache, out = self._decode(cache, tok_B, pos_B, gen_B, limit_B, seeds_B, samples_B, live_B, eager, kv_len)
    self.k, self.v = cache.k, cache.v
    return out

  def warmup(self, keep: bool = False) -> int:
    """Compile every prefill bucket and every decode KV length once, and with `keep` (the sampler serves episodes)
    extend per (chunk bucket, KV length) (all writes to scratch); returns programs."""
    ec, r, b, m = self.ec, self.ec.prefill_rows, self.ec.batch_size, self.ec.pages_per_seq
    z, zr = np.zeros((b,), np.int32), np.zeros((r,), np.int32)
    count = 0
    for bucket in ec.prefill_buckets():
      self.prefill(np.zeros((r, bucket), np.int32), np.ones((r,), np.int32), np.zeros((r, m), np.int32),
                   np.zeros((r,), np.uint32), z, z, z, z)
      count += 1
    for pages in decode_page_buckets(m):
      self.decode(np.zeros((b, m), np.int32), z, z, z, z, z.astype(np.uint32), z, z.astype(bool),
                  pages * ec.page_size)
      count += 1
      for bucket in ec.prefill_buckets() if keep else ():
        self.extend(np.zeros((r, bucket), np.int32), zr, np.ones((r,), np.int32), np.zeros((r, m), np.int32),
                    zr.astype(np.uint32), zr, pages * ec.page_size)
        count += 1  # extend_paged at (bucket, KV length)
    return count
