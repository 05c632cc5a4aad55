"""`Scheduler`: continuous batching over a fixed number of decode slots and a paged KV pool (host side).

A request (prompt, seed) asks for samples 0..n-1; `submit` queues requests, `step` runs one
scheduling round and returns the completions it finished:

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

Every sampled token is kept with its log-prob and the weights version of the device call
that made it (`device.version`, read after each prefill and decode round).

The scheduler is a pure function of its inputs and of the tokens the device returns, so in
global mode every host, given the same calls and the same (all-gathered) tokens, takes
the same decisions and issues the same programs in the same order.
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import time
from typing import Protocol, Sequence

import numpy as np

from jaxpod.sample.config import EngineConfig
from jaxpod.sample.engine import NO_TOKEN, Completion
from jaxpod.sample.pages import PagePool


def decode_page_buckets(max_pages: int) -> list[int]:
  """KV lengths (in pages) the decode program is compiled for: powers of two, then the table width."""
  out, p = [], 1
  while p < max_pages:
    out.append(p)
    p *= 2
  return out + [max_pages]


class Device(Protocol):
  """What the scheduler needs from the device side (`runner.PagedRunner`): tokens and their log-probs."""

  version: int  # label of the weights the next call runs with

  def prefill(self, tokens_RxP, lengths_R, table_RxM, seeds_R, row_D, sample_D, copy_src_D,
              copy_dst_D) -> tuple[np.ndarray, np.ndarray]: ...

  def decode(self, table_BxM, tok_B, pos_B, gen_B, limit_B, seeds_B, samples_B, live_B,
             kv_len: int) -> tuple[np.ndarray, np.ndarray]: ...


@dataclasses.dataclass
class Seq:
  """One sample of one request, from its prefill to its last token."""

  req: int  # request index
  sample: int  # sample index j (0..n-1)
  pages: list[int]  # page-table row: page of positions [i*page_size, (i+1)*page_size)
  plen: int  # prompt length
  out: list[int]  # generated tokens so far (the stop token included)
  logprobs: list[float]  # one per token of `out`
  versions: list[int]  # one per token of `out`

  def add(self, token: int, logprob: float, version: int) -> None:
    self.out.append(int(token))
    self.logprobs.append(float(logprob))
    self.versions.append(version)


class Scheduler:
  """Continuous batching through a `Device`; every host with the same calls takes the same steps."""

  def __init__(self, ec: EngineConfig, stop_ids: Sequence[int], device: Device):
    self.ec, self.stop_ids, self.device = ec, frozenset(int(i) for i in stop_ids), device
    self.pool = PagePool(ec.pool_pages)
    self.occupancy: list[tuple[float, int]] = []  # (seconds since start, live slots) per round
    self.preemptions = 0
    self.rounds = 0
    self._t0 = time.perf_counter()
    self._ids: dict[int, Sequence[int]] = {}  # request -> prompt ids (while it is not finished)
    self._seeds: dict[int, int] = {}
    self._left: dict[int, int] = {}  # request -> samples not finished yet
    self.waiting: collections.deque[tuple[int, tuple[int, ...]]] = collections.deque()  # (request, samples)
    self.ready: list[Seq] = []
    self.slots: list[Seq | None] = [None] * ec.batch_size
    self._done: list[Completion] = []  # finished in the current round
    self._digest = hashlib.sha256()

  def submit(self, request: int, ids: Sequence[int], seed: int, n: int) -> None:
    """Queue samples 0..n-1 of one request (numbered by the caller, unique)."""
    self._ids[request], self._seeds[request], self._left[request] = ids, int(seed), n
    self.waiting.append((request, tuple(range(n))))

  @property
  def pending(self) -> int:
    """Samples submitted and not finished yet."""
    return sum(self._left.values())

  @property
  def idle(self) -> bool:
    return not (self.waiting or self.ready or any(self.slots))

  def step(self) -> list[Completion]:
    """One round: admit (prefill), fill free slots, grow pages, decode `steps_per_round` tokens; returns the
    completions finished in it (at prefill or in decode)."""
    self._done = []
    self._admit()
    self._fill()
    if any(self.slots):
      self._grow()
      self.occupancy.append((time.perf_counter() - self._t0, sum(s is not None for s in self.slots)))
      self._decode()
    return self._done

  def digest(self) -> str:
    """A hash of the schedule taken (occupancy per round, preemptions, completions): equal on hosts in step."""
    text = repr(([o for _, o in self.occupancy], self.preemptions, self._digest.hexdigest()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]

  # -- admission -------------------------------------------------------------------------
  def _prompt_pages(self, plen: int, samples: int) -> int:
    partial = plen % self.ec.page_size != 0
    return -(-plen // self.ec.page_size) + (samples - 1 if partial else 0)

  def _admit(self) -> None:
    while self.waiting and self.ec.batch_size - sum(s is not None for s in self.slots) > len(self.ready):
      batch, started = [], 0  # one prefill call starts at most batch_size sequences (its static output width)
      reserve = sum(self._need(s) for s in self.slots if s is not None)  # running rows grow first
      while self.waiting and len(batch) < self.ec.prefill_rows and started < self.ec.batch_size:
        req, samples = self.waiting[0]
        plen = len(self._ids[req])
        free = self.pool.free - reserve
        most = min(len(samples), self.ec.batch_size - started)
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
    ec, r, m, d = self.ec, self.ec.prefill_rows, self.ec.pages_per_seq, self.ec.batch_size
    longest = max(len(self._ids[req]) for req, _, _ in batch)
    bucket = next(b for b in ec.prefill_buckets() if b >= longest)
    tokens, lengths = np.zeros((r, bucket), np.int32), np.ones((r,), np.int32)
    table, seeds = np.zeros((r, m), np.int32), np.zeros((r,), np.uint32)
    row_D, sample_D = np.zeros((d,), np.int32), np.zeros((d,), np.int32)  # the prompt row and sample j of each start
    src_D, dst_D = np.zeros((d,), np.int32), np.zeros((d,), np.int32)  # partial-page copies (pad: scratch to scratch)
    c = k = 0
    for row, (req, js, rows) in enumerate(batch):
      ids = self._ids[req]
      tokens[row, :len(ids)], lengths[row], seeds[row] = ids, len(ids), self._seeds[req]
      table[row, :len(rows[0])] = rows[0]
      for j in js:
        row_D[k], sample_D[k] = row, j
        k += 1
      if len(ids) % ec.page_size:
        for own in rows[1:]:
          src_D[c], dst_D[c] = rows[0][-1], own[-1]
          c += 1
    first_D, logp_D = self.device.prefill(tokens, lengths, table, seeds, row_D, sample_D, src_D, dst_D)
    version, k = self.device.version, 0
    for req, js, rows in batch:
      for j, pages in zip(js, rows):
        seq = Seq(req, j, pages, len(self._ids[req]), [], [], [])
        seq.add(first_D[k], logp_D[k], version)
        k += 1
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
    out, logp = self.device.decode(table, tok, pos, gen, limit, seeds, samples, live, pages * ec.page_size)
    version = self.device.version
    self.rounds += 1
    for i, s in enumerate(self.slots):
      if s is None:
        continue
      for t, lp in zip(out[i], logp[i]):
        if t == NO_TOKEN:
          break
        s.add(t, lp, version)
        if self._finished(s):
          self.slots[i] = None
          break

  def _finished(self, seq: Seq) -> bool:
    """Record the sequence and free its pages if its last token ends it."""
    if seq.out[-1] in self.stop_ids:
      reason = "stop"
    elif len(seq.out) >= self.ec.max_new_tokens:
      reason = "length"
    else:
      return False
    self.pool.release(seq.pages)
    done = Completion(tuple(seq.out), reason, tuple(seq.logprobs), tuple(seq.versions), seq.req, seq.sample)
    self._done.append(done)
    self._digest.update(repr((done.request, done.sample, done.sampled, done.versions)).encode())
    self._left[seq.req] -= 1
    if not self._left[seq.req]:
      del self._ids[seq.req], self._seeds[seq.req], self._left[seq.req]
    return True
