"""`Sampler`: token-id prompts in, completions out, on every host at once; plus the memory check.

Every host calls `Sampler.generate` (or `submit` / `step` / `update_params`) with the same
prompt ids (decided on the leader and broadcast). The continuous engine (`scheduler.py`, one
module per KV layout: `slots.py`, `paged.py`) decodes them in a fixed number of slots, with the KV layout `ec.kv_layout`
(slots: a row per slot read in place; paged: a shared page pool); shapes are static (slots,
prefill buckets, power-of-two KV lengths), so every host compiles the same few programs.

  global      the model is sharded over the mesh of all devices; every host runs the same
              scheduler on the same all-gathered tokens, hence the same programs in order.
  replicated  each host holds a full copy on its own devices (the mesh is built from
              `jax.local_devices()`) and schedules its share (requests h, h+H, ...) alone;
              one all-gather of fixed-shape per-host results at the end brings them to every host.
"""
from __future__ import annotations

from typing import Callable, Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils

from jaxpod import runtime
from jaxpod.models.llama.config import LlamaConfig
from jaxpod.models.llama.model import Llama, PagedKVCache
from jaxpod.runtime import mesh as mesh_lib
from jaxpod.runtime.mesh import data_parallel, device_memory_bytes
from jaxpod.sample import memory
from jaxpod.sample.config import MODES, EngineConfig, SamplingParams
from jaxpod.sample.paged import PagedRunner, PagedScheduler
from jaxpod.sample.scheduler import Scheduler
from jaxpod.sample.slots import SlotRunner, SlotScheduler
from jaxpod.sample.tokens import NO_TOKEN, Completion

LAYOUTS = {"slots": (SlotRunner, SlotScheduler), "paged": (PagedRunner, PagedScheduler)}


def make_sample_mesh(mode: str, mesh_cfg: mesh_lib.MeshConfig):
  """global: the mesh over all devices; replicated: the same layout over this host's devices."""
  if mode not in MODES:
    raise ValueError(f"sample.mode={mode!r}; use one of {MODES}")
  devices = jax.devices() if mode == "global" else jax.local_devices()
  return mesh_lib.make_mesh(mesh_cfg.data, mesh_cfg.fsdp, mesh_cfg.model, devices=devices)


def memory_plan(cfg: LlamaConfig, ec: EngineConfig, mesh) -> dict[str, int]:
  """Estimated bytes per device: weights (in the engine's inference layout), the KV cache (its data shard's page
  pool or full-capacity slots) and prefill activations."""
  dp = memory.data_shards(mesh)
  rows = max(1, max(ec.batch_size, ec.prefill_rows) // dp)
  tokens = rows * ec.max_prompt_len
  item = np.dtype(cfg.dtype).itemsize
  # one layer live at a time: residual, q/k/v/ctx, the mlp pair, and fp32 scores + probs: a prefill starts at
  # position 0 (P x P per row, no cached slot read), a decode step reads the whole capacity (1 x S per row);
  # the prompts' keys/values of every layer
  acts = tokens * (4 * cfg.hidden_size + 2 * cfg.num_attention_heads * cfg.head_dim_
                   + 2 * cfg.intermediate_size) * item
  scores = max(ec.max_prompt_len ** 2, ec.cache_len)
  acts += 2 * rows * cfg.num_attention_heads * scores * 4 // mesh.shape["model"]
  acts += 2 * tokens * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim_ * item // mesh.shape["model"]
  acts += rows * cfg.vocab_size * 4
  return {"weights": memory.engine_weight_bytes(cfg, mesh), "kv_cache": memory.kv_cache_bytes(cfg, ec, mesh),
          "activations": acts}


def check_memory(cfg: LlamaConfig, ec: EngineConfig, mesh, available: int | None = None) -> dict[str, int]:
  """Raise before compiling if weights + KV cache + activations exceed the allowed device memory."""
  plan = memory_plan(cfg, ec, mesh)
  total = sum(plan.values())
  available = available or ec.device_memory_bytes or device_memory_bytes()
  limit = int(available * ec.memory_fraction)
  page = PagedKVCache.page_bytes(cfg, ec.page_size)
  pages = "sample.num_pages" if ec.num_pages is not None else f"sample.batch_size={ec.batch_size}"
  dp = memory.data_shards(mesh)
  if ec.kv_layout == "paged":
    kv = (f"lower {pages} (each of the {dp} data shards' pools holds {ec.shard_pages(dp)} pages of {ec.page_size} "
          f"tokens, {page / 2**10:.0f} KiB each; one sequence of max_prompt_len + max_new_tokens = {ec.cache_len} "
          f"tokens needs {ec.pages_per_seq}; fits: {max(0, (limit - total + plan['kv_cache']) // page)} pages "
          "per device) or raise mesh.data/mesh.fsdp")
  else:
    kv = (f"lower sample.batch_size={ec.batch_size} (each slot holds max_prompt_len + max_new_tokens = "
          f"{ec.cache_len} tokens, {plan['kv_cache'] / ec.batch_size / 2**20:.1f} MiB per device) or use "
          "sample.kv_layout=paged with a smaller sample.num_pages")
  knobs = {
      "weights": "shard the model more (mesh.model: the engine keeps weights whole over data and fsdp) or use "
                 "dtype=bfloat16",
      "kv_cache": kv,
      "activations": f"lower sample.max_prompt_len={ec.max_prompt_len} or sample.batch_size={ec.batch_size}",
  }
  return memory.check_device_memory(plan, knobs, available, ec.memory_fraction, "sample memory check")


def check_batch(ec: EngineConfig, mesh) -> None:
  """The decode slots and the prefill rows split evenly over the mesh's data-parallel axes; paged: each data
  shard's pool holds one sequence at least."""
  dp = data_parallel(mesh)
  for name, value in (("batch_size", ec.batch_size), ("prefill_batch", ec.prefill_rows)):
    if value % dp:
      raise ValueError(f"sample.{name}={value} is not divisible by the mesh's data*fsdp={dp}; "
                       f"use a multiple of {dp} (or set mesh.data/mesh.fsdp)")
  if ec.kv_layout == "paged" and ec.shard_pages(dp) - 1 < ec.pages_per_seq:
    raise ValueError(f"sample.num_pages={ec.num_pages} splits into {ec.shard_pages(dp)} pages per data shard "
                     f"(data*fsdp={dp}), too few for one sequence of {ec.cache_len} tokens ({ec.pages_per_seq} "
                     f"pages + a scratch page); set num_pages >= {dp * (ec.pages_per_seq + 1)}")


def check_prompts(ids: Sequence[Sequence[int]], ec: EngineConfig) -> None:
  """Every prompt has 1..max_prompt_len tokens (nothing is truncated)."""
  for i, row in enumerate(ids):
    if not row:
      raise ValueError(f"prompt {i} is empty (0 tokens); every request needs at least one prompt token")
    if len(row) > ec.max_prompt_len:
      raise ValueError(f"prompt {i} has {len(row)} tokens > sample.max_prompt_len={ec.max_prompt_len}; "
                       f"raise max_prompt_len or shorten the prompt (prompts are never truncated)")


class Sampler:
  """Generate completions for tokenized prompts; in global mode every host makes the same calls.

  Run to completion with `generate`, or drive the engine yourself (RL rollout workers, in-flight
  weight updates): `submit` requests, call `step` (one scheduling round) until `idle`, and swap
  weights between steps with `update_params`; tokens sampled after the swap carry the new version."""

  def __init__(self, model: Llama, mesh, ec: EngineConfig, sp: SamplingParams, stop_ids: Sequence[int],
               mode: str = "global", version: int = 0):
    if mode not in MODES:
      raise ValueError(f"sample.mode={mode!r}; use one of {MODES}")
    check_batch(ec, mesh)
    self.mesh, self.ec, self.sp, self.mode = mesh, ec, sp, mode
    self.stop_ids = tuple(sorted(set(int(i) for i in stop_ids)))
    runner, self._scheduler_cls = LAYOUTS[ec.kv_layout]
    self.runner = runner(model, mesh, ec, sp, self.stop_ids, global_mode=mode == "global", version=version)
    self.scheduler: Scheduler = self._scheduler_cls(ec, self.stop_ids, self.runner)
    self._next_request = 0

  @property
  def last(self) -> Scheduler:
    """The scheduler (occupancy, pages, preemptions) since the latest `generate` (or since the start)."""
    return self.scheduler

  @property
  def version(self) -> int:
    """Label of the weights the next step runs with."""
    return self.runner.version

  @property
  def pending(self) -> int:
    """Samples submitted and not finished yet."""
    return self.scheduler.pending

  @property
  def idle(self) -> bool:
    """Nothing queued or running."""
    return self.scheduler.idle

  def warmup(self, n: int = 1, keep: bool = False) -> int:
    """Compile every program the engine may run, before timing or serving; returns how many. keep: it will serve
    episodes (`generate(..., keep=True)`): the programs that continue a kept sequence too. (n: unused, kept for
    callers of the old signature; prefill shapes no longer depend on it.)"""
    del n
    return self.runner.warmup(keep)

  def update_params(self, params, version: int) -> None:
    """Sample from these parameters from the next step on, labelled `version`.

    Same tree, shapes, dtypes and shardings as the current ones (no recompilation); otherwise a
    ValueError names the first leaf that differs. Sequences in flight keep their KV cache and go on."""
    self.runner.update_params(params, version)

  @property
  def kept(self) -> int:
    """Finished samples whose KV is kept (submitted with `keep`) and not continued or dropped yet."""
    return len(self.scheduler.kept)

  def drop_kept(self) -> int:
    """Free every kept KV no submitted request continues; returns how many."""
    return self.scheduler.drop_kept()

  def submit(self, ids: Sequence[Sequence[int]], seeds: Sequence[int], n: int = 1, keep: bool = False) -> list[int]:
    """Queue n samples of each prompt; returns their request numbers (increasing across calls).

    keep: each finished sample keeps its KV (slot or pages) under its tokens (prompt + sampled); a later
    one-sample request whose ids extend those tokens (an episode's next turn: + the observation) prefills
    only what was appended and decodes on. Same tokens as prefilling it whole, in fewer prefill tokens."""
    check_prompts(ids, self.ec)
    if n < 1:
      raise ValueError(f"sample.n={n} must be >= 1")
    if len(seeds) != len(ids):
      raise ValueError(f"submit: {len(ids)} prompts but {len(seeds)} seeds; give one seed per prompt")
    handles = list(range(self._next_request, self._next_request + len(ids)))
    self._next_request += len(ids)
    for h, row, seed in zip(handles, ids, seeds):
      self.scheduler.submit(h, [int(t) for t in row], int(seed), n, keep)
    return handles

  def step(self) -> list[Completion]:
    """One scheduling round (admit and prefill, then `steps_per_round` decode steps); the completions it finished."""
    return self.scheduler.step()

  def generate(self, ids: Sequence[Sequence[int]], seeds: Sequence[int],
               on_chunk: Callable[[int], None] | None = None, n: int = 1, keep: bool = False) -> list[Completion]:
    """n completions per prompt, request-major (sample j of prompt i at i*n+j, `request` = i), on every host.

    Needs an idle sampler. `on_chunk(k)` reports k more finished completions (global mode; replicated: this host's).
    keep (see `submit`): a call is a turn; kept KV that none of its prompts extends is dropped at its start."""
    if not self.idle:
      raise RuntimeError(f"Sampler.generate needs an idle sampler; {self.pending} submitted samples are not "
                         "finished: call step() until idle first")
    check_prompts(ids, self.ec)
    if n < 1:
      raise ValueError(f"sample.n={n} must be >= 1")
    if self.mode == "replicated" and jax.process_count() > 1:
      return self._generate_replicated(ids, seeds, n, on_chunk, keep)
    out = self._run(ids, seeds, n, on_chunk, keep)
    self.check_schedule()
    return out

  def begin(self) -> None:
    """Start a fresh schedule on an idle sampler (statistics restart, kept KV carried over), for a caller that
    drives `submit` / `step` itself and checks it with `check_schedule` at the end."""
    if not self.idle:
      raise RuntimeError(f"Sampler.begin needs an idle sampler; {self.pending} submitted samples are not "
                         "finished: call step() until idle first")
    old, self.scheduler = self.scheduler, self._scheduler_cls(self.ec, self.stop_ids, self.runner)
    self.scheduler.adopt(old)

  def check_schedule(self) -> None:
    """Invariant 1: every host took the same schedule since `begin` (one allgather of its digest; one host: none)."""
    if jax.process_count() == 1 or self.mode != "global":
      return
    seen = runtime.allgather(self.scheduler.digest(), "sample.schedule")
    bad = [h for h, d in enumerate(seen) if d != seen[0]]
    if bad:
      raise RuntimeError(f"sample: host(s) {bad} took a different schedule than host 0 "
                         f"(rounds/occupancy/preemptions differ); their inputs or tokens differ")

  def _run(self, ids, seeds, n, on_chunk, keep=False) -> list[Completion]:
    """A fresh schedule (statistics start again; kept KV carried over) of these requests to completion,
    request-major; kept KV they do not continue is dropped."""
    self.begin()
    first = self.submit(ids, seeds, n, keep)[0] if ids else 0
    self.scheduler.drop_kept()
    got: dict[tuple[int, int], Completion] = {}
    while not self.idle:
      done = self.step()
      for c in done:
        got[(c.request - first, c.sample)] = c._replace(request=c.request - first)
      if on_chunk and done:
        on_chunk(len(done))
    return [got[(i, j)] for i in range(len(ids)) for j in range(n)]

  def _generate_replicated(self, ids, seeds, n, on_chunk, keep=False) -> list[Completion]:
    hosts, me = jax.process_count(), jax.process_index()
    mine = list(range(me, len(ids), hosts))
    got = self._run([ids[i] for i in mine], [seeds[i] for i in mine], n, on_chunk, keep)
    per_host, width = -(-len(ids) // hosts) * n, self.ec.max_new_tokens
    head = np.zeros((per_host, 2), np.int32)  # [finish (1 = stop), sampled length]
    tokens = np.full((per_host, width), NO_TOKEN, np.int32)
    logprobs, versions = np.zeros((per_host, width), np.float32), np.zeros((per_host, width), np.int32)
    for r, c in enumerate(got):
      k = len(c.sampled)
      head[r], tokens[r, :k], logprobs[r, :k], versions[r, :k] = (c.finish_reason == "stop", k), c.sampled, \
          c.logprobs, c.versions
    every = [np.asarray(x) for x in multihost_utils.process_allgather((head, tokens, logprobs, versions))]
    out: list[Completion] = []
    for i in range(len(ids)):
      for j in range(n):
        at = (i % hosts, (i // hosts) * n + j)
        (stop, k), toks, lps, vers = (x[at] for x in every)
        out.append(Completion(tuple(int(t) for t in toks[:k]), "stop" if stop else "length",
                              tuple(float(x) for x in lps[:k]), tuple(int(v) for v in vers[:k]), i, j))
    return out
