"""`Scheduler`: continuous batching over a fixed number of decode slots (host side), for either KV layout.

A request (prompt, seed) asks for samples 0..n-1; `submit` queues requests, `step` runs one
scheduling round and returns the completions it finished:

  1. admit: take waiting requests in order and prefill them (the layout decides how many fit
     and where their keys/values go); a prompt is prefilled once for all its samples admitted
     together; every sample starts holding its first token (or finishes at once);
  2. prepare: make room for the round (paged: pages, preemption; slots: the KV capacity);
  3. decode one round of up to `steps_per_round` steps on the device; stop ids and token limits
     end sequences, whose slots are free for the next round; when work waits for a slot, the
     round ends after the first step that frees one (so it is refilled at once).

Layouts (`EngineConfig.kv_layout`):
  slots  (`slots.SlotScheduler`) slot b owns row b of per-layer [B, K, S, E] buffers. A group
         (the remaining samples of a request) is admitted when a slot is free: its prompt is
         prefilled once and copied into a free slot per sample; samples without one wait
         "parked" with the prefill's output (no second prefill) and take the next free slots
         before any new prompt. S follows the longest live row: the smallest bucket
         (`EngineConfig.kv_buckets`) above every position the round may write.
  paged  (`paged.PagedScheduler`) pages from a shared pool, prompt pages shared by a prompt's
         samples, preemption when the pool runs short.

Every sampled token is kept with its log-prob and the weights version of the device call
that made it (`device.version`, read after each prefill and decode round).

Kept sequences (multi-turn episodes): a request submitted with `keep` leaves each finished sample's
keys/values in place (its slot or its pages) under its tokens (context + sampled). A later one-sample
request whose ids start with those tokens continues it: only ids[kv:] are prefilled (the last sampled
token, never fed, and what was appended: an observation), at positions kv.. over the kept keys, and
decoding goes on (a new turn: its own seed, token limit and versions; the earlier tokens' KV stays as
it was, across a weight swap too). Kept sequences nobody claimed are dropped when their slot or pages
are needed (oldest first), or by `drop_kept`; a request whose kept sequence is gone, or was never kept,
is prefilled whole (the same tokens: continuing is an optimisation, not a different result).

The scheduler is a pure function of its inputs and of the tokens the device returns, so in
global mode every host, given the same calls and the same (all-gathered) tokens, takes
the same decisions and issues the same programs in the same order.
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import time
from typing import Sequence

import numpy as np

from jaxpod.runtime import progress
from jaxpod.sample.config import EngineConfig
from jaxpod.sample.tokens import NO_TOKEN, Completion


@dataclasses.dataclass(eq=False)  # compared by identity (a slot, a kept entry)
class Seq:
  """One sample of one request, from its prefill to its last token."""

  req: int  # request number
  sample: int  # sample index j (0..n-1)
  plen: int  # prompt length
  out: list[int] = dataclasses.field(default_factory=list)  # generated tokens so far (the stop token included)
  logprobs: list[float] = dataclasses.field(default_factory=list)  # one per token of `out`
  versions: list[int] = dataclasses.field(default_factory=list)  # one per token of `out`
  pages: list[int] = dataclasses.field(default_factory=list)  # paged: page of positions [i*ps, (i+1)*ps)
  shard: int = 0  # paged: the data shard whose pages (and slots) it uses

  def add(self, token: int, logprob: float, version: int) -> None:
    self.out.append(int(token))
    self.logprobs.append(float(logprob))
    self.versions.append(version)


class Scheduler:
  """Requests, rounds and completions; the layout subclasses admit, prepare and call the device."""

  def __init__(self, ec: EngineConfig, stop_ids: Sequence[int], device):
    self.ec, self.stop_ids, self.device = ec, frozenset(int(i) for i in stop_ids), device
    self.occupancy: list[tuple[float, int]] = []  # (seconds since start, live slots) per round
    self.preemptions = self.rounds = 0
    self.decode_steps = 0  # decode steps the device ran (a round ends early once every row stopped, or eagerly)
    self.prefill_tokens = 0  # token rows the prefill programs computed (padding included)
    self.prefill_prompt_tokens = 0  # real prompt tokens among them
    self.sample_prompt_tokens = 0  # prompt tokens of the samples started (a prompt counts once per sample)
    self._t0 = time.perf_counter()
    self._ids: dict[int, Sequence[int]] = {}  # request -> prompt ids (while it is not finished)
    self._seeds: dict[int, int] = {}
    self._left: dict[int, int] = {}  # request -> samples not finished yet
    self.waiting: collections.deque[tuple[int, tuple[int, ...]]] = collections.deque()  # (request, samples)
    self.ready: list[Seq] = []  # prefilled, waiting for a slot (paged only)
    self.slots: list[Seq | None] = [None] * ec.batch_size
    self._done: list[Completion] = []  # finished in the current round
    self._digest = hashlib.sha256()
    self.kept: dict[tuple[int, ...], Seq] = {}  # tokens (context + sampled) -> a finished sequence whose KV is kept
    self._keep: set[int] = set()  # requests whose finished samples keep their KV
    self._parent: dict[int, Seq] = {}  # request -> the kept sequence it continues (claimed, not evictable)
    self.extended = 0  # sequences continued from a kept one (only the new tokens prefilled)

  def submit(self, request: int, ids: Sequence[int], seed: int, n: int, keep: bool = False) -> None:
    """Queue samples 0..n-1 of one request (numbered by the caller, unique); `keep`: each finished sample keeps
    its KV for a continuation. A one-sample request extending a kept sequence's tokens continues it."""
    self._ids[request], self._seeds[request], self._left[request] = ids, int(seed), n
    if keep:
      self._keep.add(request)
    if n == 1 and self.kept:
      for length in sorted({len(k) for k in self.kept if len(k) <= len(ids)}, reverse=True):
        parent = self.kept.pop(tuple(ids[:length]), None)
        if parent is not None:
          self._parent[request] = parent
          break
    self.waiting.append((request, tuple(range(n))))

  def adopt(self, old: "Scheduler") -> None:
    """Take over the kept sequences of an idle scheduler (a new schedule on the same device: statistics restart)."""
    self.kept = old.kept

  def drop_kept(self) -> int:
    """Free every kept sequence nobody claimed; returns how many."""
    dropped = list(self.kept.values())
    self.kept = {}
    for seq in dropped:
      self._drop(seq)
    return len(dropped)

  def _evict(self, shard: int | None = None) -> bool:
    """Free the oldest unclaimed kept sequence (of `shard` if given); False if none."""
    key = next((k for k, s in self.kept.items() if shard is None or s.shard == shard), None)
    if key is None:
      return False
    self._drop(self.kept.pop(key))
    return True

  def _unclaim(self, req: int) -> None:
    """Give up continuing `req` from its kept sequence (freed): it is prefilled whole."""
    self._drop(self._parent.pop(req))

  @property
  def pending(self) -> int:
    """Samples submitted and not finished yet."""
    return sum(self._left.values())

  @property
  def idle(self) -> bool:
    return not (self.waiting or self.ready or any(self.slots))

  def step(self) -> list[Completion]:
    """One round: admit (prefill), prepare, decode `steps_per_round` tokens; the completions finished in it."""
    self._done = []
    progress.touch()  # a round is progress for the watchdog (in whatever phase samples: rollout, eval, sample)
    self._admit()
    if any(self.slots):
      self._prepare()
      self.occupancy.append((time.perf_counter() - self._t0, sum(s is not None for s in self.slots)))
      self._decode()
    return self._done

  def digest(self) -> str:
    """A hash of the schedule taken (occupancy per round, preemptions, completions): equal on hosts in step."""
    text = repr(([o for _, o in self.occupancy], self.preemptions, self._digest.hexdigest()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]

  # -- layout hooks ------------------------------------------------------------------------
  def _admit(self) -> None:
    raise NotImplementedError

  def _prepare(self) -> None:
    raise NotImplementedError

  def _device_decode(self, rows: dict[str, np.ndarray], last: int):
    """(tokens [B, steps], log-probs [B, steps]) of one round; `last`: the highest position it may feed."""
    raise NotImplementedError

  def _release(self, seq: Seq) -> None:
    """Free what a finished sequence holds."""

  def _hold(self, seq: Seq) -> bool:
    """Keep a finished sequence's KV where it is (False: it cannot be kept, so it is released)."""
    return False

  def _drop(self, seq: Seq) -> None:
    """Free a kept sequence's KV."""
    self._release(seq)

  # -- shared parts ------------------------------------------------------------------------
  def _prompt_rows(self, batch, rows=None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(tokens [R, P], lengths [R], seeds [R], row_D, sample_D) of a prefill of `batch` = [(request, samples), ...]
    (item i in prompt row rows[i]; default: row i)."""
    ec, r, d = self.ec, self.ec.prefill_rows, self.ec.batch_size
    longest = max(len(self._ids[req]) for req, *_ in batch)
    bucket = next(b for b in ec.prefill_buckets() if b >= longest)
    tokens, lengths, seeds = np.zeros((r, bucket), np.int32), np.ones((r,), np.int32), np.zeros((r,), np.uint32)
    row_D, sample_D = np.zeros((d,), np.int32), np.zeros((d,), np.int32)
    k = 0
    for i, (req, js, *_) in enumerate(batch):
      row, ids = i if rows is None else rows[i], self._ids[req]
      tokens[row, :len(ids)], lengths[row], seeds[row] = ids, len(ids), self._seeds[req]
      for j in js:
        row_D[k], sample_D[k] = row, j
        k += 1
      self.prefill_prompt_tokens += len(ids)
      self.sample_prompt_tokens += len(ids) * len(js)
    self.prefill_tokens += r * bucket
    return tokens, lengths, seeds, row_D, sample_D

  def _chunk_rows(self, items, rows: int) -> tuple[np.ndarray, ...]:
    """(tokens [R, T], start [R], lengths [R], seeds [R], samples [R]) of continuations `items` = [(row, request,
    sample, parent), ...]: each row feeds its request's ids from the parent's KV length on (pad rows: 1 token)."""
    chunks = {req: self._ids[req][p.plen + len(p.out) - 1:] for _, req, _, p in items}
    bucket = next(b for b in self.ec.prefill_buckets() if b >= max(map(len, chunks.values())))
    tokens, start, lengths = np.zeros((rows, bucket), np.int32), np.zeros((rows,), np.int32), np.ones((rows,), np.int32)
    seeds, samples = np.zeros((rows,), np.uint32), np.zeros((rows,), np.int32)
    for row, req, j, p in items:
      c = chunks[req]
      tokens[row, :len(c)], start[row], lengths[row] = c, len(self._ids[req]) - len(c), len(c)
      seeds[row], samples[row] = self._seeds[req], j
      self.prefill_prompt_tokens += len(c)
      self.sample_prompt_tokens += len(self._ids[req])
    self.prefill_tokens += rows * bucket
    self.extended += len(items)
    return tokens, start, lengths, seeds, samples

  def _continued(self, req: int, j: int, parent: Seq, first: int, logp: float) -> Seq:
    """The sequence continuing `parent` as request `req` (its pages taken over), its first token recorded."""
    seq = Seq(req, j, len(self._ids[req]), pages=parent.pages, shard=parent.shard)
    seq.add(first, logp, self.device.version)
    return seq

  def _started(self, batch, first_D, logp_D) -> list[Seq]:
    """The sequences a prefill started (in batch order), their first tokens recorded; finished ones dropped."""
    version, k, out = self.device.version, 0, []
    for req, js, *rest in batch:
      for c, j in enumerate(js):
        seq = Seq(req, j, len(self._ids[req]), pages=rest[0][c] if rest else [], shard=rest[1] if rest else 0)
        seq.add(first_D[k], logp_D[k], version)
        k += 1
        out.append(None if self._finished(seq) else seq)
    return out

  def _last_pos(self, seq: Seq) -> int:
    """Position of the last token the next round may feed for this sequence."""
    fed = seq.plen + len(seq.out) - 1  # position of the token fed first
    return min(fed + self.ec.steps_per_round - 1, seq.plen + self.ec.max_new_tokens - 2)

  def _decode(self) -> None:
    b = self.ec.batch_size
    rows = {k: np.zeros((b,), np.int32) for k in ("tok", "pos", "gen", "samples")}
    rows["seeds"], rows["live"] = np.zeros((b,), np.uint32), np.zeros((b,), bool)
    rows["pos"][:] = self.ec.cache_len  # an idle row's writes fall past every buffer (a kept slot stays intact)
    last = 0
    for i, s in enumerate(self.slots):
      if s is None:
        continue
      rows["tok"][i], rows["pos"][i], rows["gen"][i] = s.out[-1], s.plen + len(s.out) - 1, len(s.out)
      rows["seeds"][i], rows["samples"][i], rows["live"][i] = self._seeds[s.req], s.sample, True
      last = max(last, self._last_pos(s))
    rows["limit"] = np.full((b,), self.ec.max_new_tokens, np.int32)
    out, logp = self._device_decode(rows, last)
    version = self.device.version
    self.rounds += 1
    self.decode_steps += int((np.asarray(out) != NO_TOKEN).sum(axis=1).max(initial=0))
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
    """Record the sequence and free what it holds if its last token ends it."""
    if seq.out[-1] in self.stop_ids:
      reason = "stop"
    elif len(seq.out) >= self.ec.max_new_tokens:
      reason = "length"
    else:
      return False
    key = tuple(self._ids[seq.req]) + tuple(seq.out)
    if seq.req in self._keep and key not in self.kept and self._hold(seq):  # the same tokens twice: kept once
      self.kept[key] = seq
    else:
      self._release(seq)
    done = Completion(tuple(seq.out), reason, tuple(seq.logprobs), tuple(seq.versions), seq.req, seq.sample)
    self._done.append(done)
    self._digest.update(repr((done.request, done.sample, done.sampled, done.versions)).encode())
    self._left[seq.req] -= 1
    if not self._left[seq.req]:
      del self._ids[seq.req], self._seeds[seq.req], self._left[seq.req]
      self._keep.discard(seq.req)
    return True
