"""`Scheduler`: continuous batching over a fixed number of decode slots and a paged KV pool (host side).

A request (prompt, seed) asks for samples 0..n-1. Each scheduling round:

  1. admit: while slots are free (not running, not already waiting in `ready`), take
     waiting requests in order, up to `prefill_rows` per call, pad them to the smallest
     prefill bucket that fits the longest, give each prompt its pages (full pages shared by
     its samples, the partial last page copied per extra sample) and prefill; every sample
     becomes a ready sequence holding its first token (or finishes at once);
  2. fill: ready sequences take free slots (a slot is just a page-table row: no device work);
  3. grow: each running sequence gets the pages its next `steps_per_round` tokens need; if
     the pool is short, the newest sequences are preempted (pages dropped, the sample goes
     back to the front of the queue and restarts; per-sample seeds make the restart draw
     the same tokens);
  4. decode one round on the device; stop ids and token limits end sequences, whose pages
     and slots are free for the next round.

The scheduler is a pure function of its inputs and of the tokens the device returns, so in
global mode every host, given the same prompts and the same (all-gathered) tokens, takes
the same decisions and issues the same programs in the same order.
"""
from __future__ import annotations

import collections
import dataclasses
import time
from typing import Callable, Protocol, Sequence

import numpy as np

from jaxpod.sample.config import EngineConfig
from jaxpod.sample.engine import NO_TOKEN
from jaxpod.sample.pages import PagePool


def decode_page_buckets(max_pages: int) -> list[int]:
  """KV lengths (in pages) the decode program is compiled for: powers of two, then the table width."""
  out, p = [], 1
  while p < max_pages:
    out.append(p)
    p *= 2
  return out + [max_pages]


Completion = tuple[list[int], str]  # (new token ids without the stop token, "stop" | "length")


class Device(Protocol):
  """What the scheduler needs from the device side (`runner.PagedRunner`)."""

  def prefill(self, tokens_RxP, lengths_R, table_RxM, seeds_R, samples_RxN, copy_src_C,
              copy_dst_C) -> np.ndarray: ...

  def decode(self, table_BxM, tok_B, pos_B, gen_B, limit_B, seeds_B, samples_B, live_B,
             kv_len: int) -> np.ndarray: ...


@dataclasses.dataclass
class Seq:
  """One sample of one request, from its prefill to its last token."""

  req: int  # request index
  sample: int  # sample index j (0..n-1)
  pages: list[int]  # page-table row: page of positions [i*page_size, (i+1)*page_size)
  plen: int  # prompt length
  out: list[int]  # generated tokens so far (the stop token included)


class Scheduler:
  """Runs requests to completion through a `Device`; every host with the same inputs takes the same steps."""

  def __init__(self, ec: EngineConfig, stop_ids: Sequence[int], device: Device):
    self.ec, self.stop_ids, self.device = ec, frozenset(int(i) for i in stop_ids), device
    self.pool = PagePool(ec.pool_pages)
    self.occupancy: list[tuple[float, int]] = []  # (seconds since start, live slots) per round
    self.preemptions = 0
    self.rounds = 0

  def run(self, ids: Sequence[Sequence[int]], seeds: Sequence[int], n: int = 1,
          on_done: Callable[[int], None] | None = None) -> list[Completion]:
    """Completions of every request, request-major: sample j of request i at index i * n + j."""
    self._ids, self._seeds, self._n, self._on_done = ids, seeds, n, on_done
    self.waiting = collections.deque((i, tuple(range(n))) for i in range(len(ids)))
    self.ready: list[Seq] = []
    self.slots: list[Seq | None] = [None] * self.ec.batch_size
    self.results: dict[tuple[int, int], Completion] = {}
    t0 = time.perf_counter()
    while self.waiting or self.ready or any(self.slots):
      self._admit()
      self._fill()
      if not any(self.slots):
        continue
      self._grow()
      self.occupancy.append((time.perf_counter() - t0, sum(s is not None for s in self.slots)))
      self._decode()
    return [self.results[(i, j)] for i in range(len(ids)) for j in range(n)]

  def digest(self) -> str:
    """A hash of the schedule taken (occupancy per round, preemptions, results): equal on hosts in step."""
    import hashlib
    text = repr(([o for _, o in self.occupancy], self.preemptions, sorted(self.results.items())))
    return hashlib.sha256(text.encode()).hexdigest()[:16]

  # -- admission -------------------------------------------------------------------------
  def _prompt_pages(self, plen: int, samples: int) -> int:
    partial = plen % self.ec.page_size != 0
    return -(-plen // self.ec.page_size) + (samples - 1 if partial else 0)

  def _admit(self) -> None:
    while self.waiting and self.ec.batch_size - sum(s is not None for s in self.slots) > len(self.ready):
      batch = []
      reserve = sum(self._need(s) for s in self.slots if s is not None)  # running rows grow first
      while self.waiting and len(batch) < self.ec.prefill_rows:
        req, samples = self.waiting[0]
        plen = len(self._ids[req])
        free = self.pool.free - reserve
        fit = max((k for k in range(1, len(samples) + 1) if self._prompt_pages(plen, k) <= free), default=0)
        if fit == 0:
          break
        self.waiting.popleft()
        if fit < len(samples):  # the rest waits for pages
          self.waiting.appendleft((req, samples[fit:]))
        batch.append((req, samples[:fit], self._take_prompt_pages(plen, fit)))
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
    ec, r, m = self.ec, self.ec.prefill_rows, self.ec.pages_per_seq
    longest = max(len(self._ids[req]) for req, _, _ in batch)
    bucket = next(b for b in ec.prefill_buckets() if b >= longest)
    n = self._n
    tokens, lengths = np.zeros((r, bucket), np.int32), np.ones((r,), np.int32)
    table, seeds = np.zeros((r, m), np.int32), np.zeros((r,), np.uint32)
    samples = np.zeros((r, n), np.int32)
    src, dst = np.zeros((max(1, r * (n - 1)),), np.int32), np.zeros((max(1, r * (n - 1)),), np.int32)
    c = 0
    for row, (req, js, rows) in enumerate(batch):
      ids = self._ids[req]
      tokens[row, :len(ids)], lengths[row], seeds[row] = ids, len(ids), self._seeds[req]
      table[row, :len(rows[0])] = rows[0]
      samples[row, :len(js)] = js
      if len(ids) % ec.page_size:
        for own in rows[1:]:
          src[c], dst[c] = rows[0][-1], own[-1]
          c += 1
    first = self.device.prefill(tokens, lengths, table, seeds, samples, src, dst)
    for row, (req, js, rows) in enumerate(batch):
      for col, (j, pages) in enumerate(zip(js, rows)):
        seq = Seq(req, j, pages, len(self._ids[req]), [int(first[row, col])])
        if not self._finished(seq):
          self.ready.append(seq)

  def _fill(self) -> None:
    for i, s in enumerate(self.slots):
      if s is None and self.ready:
        self.slots[i] = self.ready.pop(0)

  # -- pages for the next round, preemption ----------------------------------------------
  def _last_pos(self, seq: Seq) -> int:
    """Position of the last token the next round may feed for this sequence."""
    fed = seq.plen + len(seq.out) - 1  # position of the token fed first
    return min(fed + self.ec.steps_per_round - 1, seq.plen + self.ec.max_new_tokens - 2)

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

  # -- decode ------------------------------------------------------------------------------
  def _decode(self) -> None:
    ec, b, m = self.ec, self.ec.batch_size, self.ec.pages_per_seq
    table = np.zeros((b, m), np.int32)
    tok, pos, gen = np.zeros((b,), np.int32), np.zeros((b,), np.int32), np.zeros((b,), np.int32)
    seeds, samples, live = np.zeros((b,), np.uint32), np.zeros((b,), np.int32), np.zeros((b,), bool)
    last = 0
    for i, s in enumerate(self.slots):
      if s is None:
        continue
      table[i, :len(s.pages)] = s.pages
      tok[i], pos[i], gen[i] = s.out[-1], s.plen + len(s.out) - 1, len(s.out)
      seeds[i], samples[i], live[i] = self._seeds[s.req], s.sample, True
      last = max(last, self._last_pos(s))
    pages = next(p for p in decode_page_buckets(m) if p * ec.page_size > last)  # few programs: power-of-two KV
    limit = np.full((b,), ec.max_new_tokens, np.int32)
    out = self.device.decode(table, tok, pos, gen, limit, seeds, samples, live, pages * ec.page_size)
    self.rounds += 1
    for i, s in enumerate(self.slots):
      if s is None:
        continue
      for t in out[i]:
        if t == NO_TOKEN:
          break
        s.out.append(int(t))
        if self._finished(s):
          self.slots[i] = None
          break

  def _finished(self, seq: Seq) -> bool:
    """Record the sequence and free its pages if its last token ends it."""
    if seq.out[-1] in self.stop_ids:
      result = (seq.out[:-1], "stop")
    elif len(seq.out) >= self.ec.max_new_tokens:
      result = (seq.out, "length")
    else:
      return False
    self.pool.release(seq.pages)
    self.results[(seq.req, seq.sample)] = result
    if self._on_done:
      self._on_done(1)
    return True
