"""The paged KV layout: pages of `page_size` tokens from a shared pool, a page table per sequence.

Page 0 is the scratch page (never handed out): unused page-table entries point at it. A
prompt's full pages are shared by its n samples (one reference each); a page returns to
the free list when its last reference is dropped.

  prefill_paged   (program) R prompts right-padded to a bucket length, written into their pages; the
                  first token of each of up to D = batch_size sequences it starts (samples of those
                  prompts); then the copies of each prompt's partial last page into the own page of
                  each extra sample (copy-on-write of the one page they cannot share).
  PagePool        a free list and a reference count per page.
  PagedScheduler  (host side) admission, page growth, preemption when the pool runs short.
  PagedRunner     (device side) page pools [L, P, page_size, K, E], sharded like the model's kv heads
                  and whole over the data axes (any row may use any page).
"""
from __future__ import annotations

import time
from typing import Sequence

import numpy as np
from flax import nnx

from jaxpod.models.llama.model import PAGE_AXES, Llama, PagedKVCache
from jaxpod.sample.config import EngineConfig, SamplingParams
from jaxpod.sample.runner import Runner
from jaxpod.sample.scheduler import Scheduler, Seq
from jaxpod.sample.steps import Program, prompts_forward


def prefill_paged(graphdef, params, k_pool, v_pool, tokens_RxP, lengths_R, table_RxM, seeds_R, row_D, sample_D,
                  copy_src_D, copy_dst_D, *, sp: SamplingParams):
  """Pure: (k_pool, v_pool, first tokens [D], their log-probs [D]) after writing R prompts into their pages."""
  model: Llama = nnx.merge(graphdef, params)
  cache, positions_RxP, first_D, logp_D = prompts_forward(model, tokens_RxP, lengths_R, seeds_R, row_D, sample_D,
                                                          PagedKVCache(k_pool, v_pool, table_RxM), sp)
  committed = cache.write(cache.pending(positions_RxP))
  k, v = committed.k, committed.v
  k = k.at[:, copy_dst_D].set(k[:, copy_src_D])  # pad entries copy scratch onto scratch
  v = v.at[:, copy_dst_D].set(v[:, copy_src_D])
  return k, v, first_D, logp_D


PREFILL = Program("prefill_paged", prefill_paged, (2, 3), True)


class PagePool:
  """Free list + reference counts over pages 1..num_pages-1."""

  def __init__(self, num_pages: int):
    self.num_pages = num_pages
    self._free = list(range(num_pages - 1, 0, -1))  # pop() hands out low page ids first
    self._refs = [0] * num_pages
    self.peak_used = 0  # most pages held at once

  @property
  def free(self) -> int:
    return len(self._free)

  @property
  def used(self) -> int:
    return self.num_pages - 1 - len(self._free)

  def alloc(self, count: int) -> list[int]:
    """`count` fresh pages with one reference each; raises if fewer are free (callers check `free`)."""
    if count > len(self._free):
      raise RuntimeError(f"page pool: {count} pages asked, {len(self._free)} free")
    got = [self._free.pop() for _ in range(count)]
    for p in got:
      self._refs[p] = 1
    self.peak_used = max(self.peak_used, self.used)
    return got

  def share(self, pages: list[int]) -> list[int]:
    """One more reference to each page (a sample sharing its prompt's full pages)."""
    for p in pages:
      self._refs[p] += 1
    return list(pages)

  def release(self, pages: list[int]) -> None:
    """Drop one reference to each page; pages nobody holds go back to the free list."""
    for p in pages:
      self._refs[p] -= 1
      if self._refs[p] == 0:
        self._free.append(p)
      elif self._refs[p] < 0:
        raise RuntimeError(f"page pool: page {p} released more often than taken")


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
  """

  def __init__(self, ec: EngineConfig, stop_ids: Sequence[int], device):
    super().__init__(ec, stop_ids, device)
    self.pool = PagePool(ec.pool_pages)

  # -- admission -------------------------------------------------------------------------
  def _prompt_pages(self, plen: int, samples: int) -> int:
    partial = plen % self.ec.page_size != 0
    return -(-plen // self.ec.page_size) + (samples - 1 if partial else 0)

  def _admit(self) -> None:
    self._prefill_waiting()
    for i, s in enumerate(self.slots):  # ready sequences take free slots
      if s is None and self.ready:
        self.slots[i] = self.ready.pop(0)

  def _prefill_waiting(self) -> None:
    while self.waiting and self.ec.batch_size - sum(s is not None for s in self.slots) > len(self.ready):
      batch, started = [], 0  # one prefill call starts at most batch_size sequences (its static output width)
      reserve = sum(self._need(s) for s in self.slots if s is not None)  # running rows grow first
      while self.waiting and len(batch) < self.ec.prefill_rows and started < self.ec.batch_size:
        req, samples = self.waiting[0]
        if started and len(samples) > self.ec.batch_size - started:  # at most batch_size sequences per prefill:
          break                                                       # this group goes whole into the next one
        plen = len(self._ids[req])
        free = self.pool.free - reserve
        most = min(len(samples), self.ec.batch_size)
        fit = max((k for k in range(1, most + 1) if self._prompt_pages(plen, k) <= free), default=0)
        if fit == 0:
          break
        self.waiting.popleft()
        if fit < len(samples):  # the rest waits for pages
          self.waiting.appendleft((req, samples[fit:]))
        batch.append((req, samples[:fit], self._take_prompt_pages(plen, fit)))
        started += fit
      if not batch:
        return
      self._prefill(batch)

  def _take_prompt_pages(self, plen: int, k: int) -> list[list[int]]:
    """Page rows of k samples of one prompt: shared full pages, own partial page (a copy for j > 0)."""
    ps = self.ec.page_size
    full, partial = plen // ps, plen % ps != 0
    first = self.pool.alloc(full + partial)
    rows = [first]
    for _ in range(k - 1):
      rows.append(self.pool.share(first[:full]) + (self.pool.alloc(1) if partial else []))
    return rows

  def _prefill(self, batch) -> None:
    ec, d = self.ec, self.ec.batch_size
    tokens, lengths, seeds, row_D, sample_D = self._prompt_rows(batch)
    table = np.zeros((ec.prefill_rows, ec.pages_per_seq), np.int32)
    src_D, dst_D = np.zeros((d,), np.int32), np.zeros((d,), np.int32)  # partial-page copies (pad: scratch to scratch)
    c = 0
    for row, (req, _, rows) in enumerate(batch):
      table[row, :len(rows[0])] = rows[0]
      if len(self._ids[req]) % ec.page_size:
        for own in rows[1:]:
          src_D[c], dst_D[c] = rows[0][-1], own[-1]
          c += 1
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
      while need > self.pool.free and self._preempt(keep=seq):
        pass
      if need > 0:
        seq.pages += self.pool.alloc(need)

  def _preempt(self, keep: Seq) -> bool:
    """Free the pages of the newest ready or running sequence other than `keep`; False if none."""
    if self.ready:
      victim = self.ready.pop()
    else:
      live = [i for i, s in enumerate(self.slots) if s is not None and s is not keep]
      if not live:
        return False
      i = min(live, key=lambda i: len(self.slots[i].out))
      victim, self.slots[i] = self.slots[i], None
    self.pool.release(victim.pages)
    self.waiting.appendleft((victim.req, (victim.sample,)))
    self.preemptions += 1
    return True

  def _release(self, seq: Seq) -> None:
    self.pool.release(seq.pages)

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
  """Page pools + compiled prefill/decode."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    cfg, ec = self.cfg, self.ec
    shape = (cfg.num_hidden_layers, ec.pool_pages, ec.page_size, cfg.num_key_value_heads, cfg.head_dim_)
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

  def decode(self, table_BxM, tok_B, pos_B, gen_B, limit_B, seeds_B, samples_B, live_B, kv_len: int,
             eager: bool = False):
    """(tokens [B, steps], their log-probs [B, steps]) on this host; rows read kv_len slots of their pages."""
    cache = PagedKVCache(self.k, self.v, self._put(table_BxM))
    cache, out = self._decode(cache, tok_B, pos_B, gen_B, limit_B, seeds_B, samples_B, live_B, eager, kv_len)
    self.k, self.v = cache.k, cache.v
    return out

  def warmup(self) -> int:
    """Compile every prefill bucket and every decode KV length once (all writes to scratch); returns programs."""
    ec, r, b, m = self.ec, self.ec.prefill_rows, self.ec.batch_size, self.ec.pages_per_seq
    z = np.zeros((b,), np.int32)
    count = 0
    for bucket in ec.prefill_buckets():
      self.prefill(np.zeros((r, bucket), np.int32), np.ones((r,), np.int32), np.zeros((r, m), np.int32),
                   np.zeros((r,), np.uint32), z, z, z, z)
      count += 1
    for pages in decode_page_buckets(m):
      self.decode(np.zeros((b, m), np.int32), z, z, z, z, z.astype(np.uint32), z, z.astype(bool),
                  pages * ec.page_size)
      count += 1
    return count
