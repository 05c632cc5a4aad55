"""`Sampler`: token-id prompts in, completions out, on every host at once; plus the memory check.

Every host calls `Sampler.generate` with the same prompt ids (decided on the leader and
broadcast); prompts are cut into fixed-shape chunks of `batch_size` rows, the last one
padded with dummy rows, so every host compiles and runs the same program.

  global      the model is sharded over the mesh of all devices; every host runs every
              chunk; each chunk's tokens are gathered with a device all-gather.
  replicated  each host holds a full copy on its own devices (the mesh is built from
              `jax.local_devices()`); host h decodes chunks h, h+n, ...; one all-gather of
              the fixed-shape per-host results at the end brings them to every host.
"""
from __future__ import annotations

import math
import os
from typing import Callable, Sequence

import jax
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec

from jaxpod.models.llama.config import LlamaConfig
from jaxpod.models.llama.model import CACHE_AXES, Llama, abstract
from jaxpod.runtime import mesh as mesh_lib
from jaxpod.runtime.sharding import DEFAULT as DEFAULT_RULES, state_shardings
from jaxpod.sample import engine
from jaxpod.sample.config import MODES, EngineConfig, SamplingParams

Completion = tuple[list[int], str]  # (new token ids without the stop token, finish reason)


def make_sample_mesh(mode: str, mesh_cfg: mesh_lib.MeshConfig):
  """global: the mesh over all devices; replicated: the same layout over this host's devices."""
  if mode not in MODES:
    raise ValueError(f"sample.mode={mode!r}; use one of {MODES}")
  devices = jax.devices() if mode == "global" else jax.local_devices()
  return mesh_lib.make_mesh(mesh_cfg.data, mesh_cfg.fsdp, mesh_cfg.model, devices=devices)


def _per_device_bytes(shape, dtype, sharding) -> int:
  return math.prod(sharding.shard_shape(tuple(shape))) * np.dtype(dtype).itemsize


def device_memory_bytes() -> int:
  """Memory of one local device: the accelerator's limit, or host RAM / local devices on CPU."""
  dev = jax.local_devices()[0]
  stats = dev.memory_stats() if hasattr(dev, "memory_stats") else None
  if stats and stats.get("bytes_limit"):
    return int(stats["bytes_limit"])
  return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // len(jax.local_devices())


def memory_plan(cfg: LlamaConfig, ec: EngineConfig, mesh) -> dict[str, int]:
  """Estimated bytes per device: weights, KV cache and prefill activations (the peak)."""
  _, abs_state = nnx.split(abstract(cfg))
  shardings = state_shardings(abs_state, mesh)
  weights = sum(_per_device_bytes(v.shape, v.dtype, s) for v, s in zip(
      jax.tree.leaves(abs_state), jax.tree.leaves(shardings)))
  cache_shape = (cfg.num_hidden_layers, ec.batch_size, cfg.num_key_value_heads, ec.cache_len, cfg.head_dim_)
  cache_sh = NamedSharding(mesh, DEFAULT_RULES.fitted_spec(CACHE_AXES, cache_shape, mesh, "kv_cache"))
  cache = 2 * _per_device_bytes(cache_shape, cfg.dtype, cache_sh)
  dp = mesh.shape["data"] * mesh.shape["fsdp"]
  rows = max(1, ec.batch_size // dp)
  tokens = rows * ec.max_prompt_len
  item = np.dtype(cfg.dtype).itemsize
  # one layer live at a time: residual, q/k/v/ctx, the mlp pair, and fp32 scores + probs over the prompt slots
  acts = tokens * (4 * cfg.hidden_size + 2 * cfg.num_attention_heads * cfg.head_dim_
                   + 2 * cfg.intermediate_size) * item
  acts += 2 * rows * cfg.num_attention_heads * ec.max_prompt_len ** 2 * 4 // mesh.shape["model"]
  acts += rows * cfg.vocab_size * 4
  return {"weights": weights, "kv_cache": cache, "activations": acts}


def check_memory(cfg: LlamaConfig, ec: EngineConfig, mesh, available: int | None = None) -> dict[str, int]:
  """Raise before compiling if weights + KV cache + activations exceed the allowed device memory."""
  plan = memory_plan(cfg, ec, mesh)
  total = sum(plan.values())
  limit = int((available or ec.device_memory_bytes or device_memory_bytes()) * ec.memory_fraction)
  if total <= limit:
    return plan
  knobs = {
      "weights": "shard the model more (mesh.model / mesh.fsdp, global mode) or use dtype=bfloat16",
      "kv_cache": f"lower sample.batch_size={ec.batch_size} or sample.max_new_tokens={ec.max_new_tokens} "
                  f"(cache slots = max_prompt_len + max_new_tokens = {ec.cache_len})",
      "activations": f"lower sample.max_prompt_len={ec.max_prompt_len} or sample.batch_size={ec.batch_size}",
  }
  worst = max(plan, key=plan.get)
  parts = " + ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in plan.items())
  raise ValueError(f"sample memory check: {parts} = {total / 2**20:.1f} MiB per device exceeds "
                   f"{limit / 2**20:.1f} MiB (memory_fraction={ec.memory_fraction} of the device); "
                   f"the largest part is {worst}: {knobs[worst]}")


def check_batch(ec: EngineConfig, mesh) -> None:
  """The batch splits evenly over the mesh's data-parallel axes."""
  dp = mesh.shape["data"] * mesh.shape["fsdp"]
  if ec.batch_size % dp:
    raise ValueError(f"sample.batch_size={ec.batch_size} is not divisible by the mesh's data*fsdp={dp}; "
                     f"use a multiple of {dp} (or set mesh.data/mesh.fsdp)")


class Sampler:
  """Generate completions for tokenized prompts; every host calls `generate` with the same inputs."""

  def __init__(self, model: Llama, mesh, ec: EngineConfig, sp: SamplingParams, stop_ids: Sequence[int],
               mode: str = "global"):
    if mode not in MODES:
      raise ValueError(f"sample.mode={mode!r}; use one of {MODES}")
    check_batch(ec, mesh)
    self.mesh, self.ec, self.sp, self.mode = mesh, ec, sp, mode
    self.stop_ids = tuple(sorted(set(int(i) for i in stop_ids)))
    self.graphdef, self.params = nnx.split(model)
    self._fn = engine.compiled_generate(ec, sp, self.stop_ids)
    self._batch_sh = NamedSharding(mesh, DEFAULT_RULES.spec(("batch", "seq"), mesh))

  def _chunk_arrays(self, ids: Sequence[Sequence[int]], seeds: Sequence[int]):
    b, p = self.ec.batch_size, self.ec.max_prompt_len
    tokens = np.zeros((b, p), np.int32)
    lengths = np.ones((b,), np.int32)
    seeds_arr = np.zeros((b,), np.uint32)
    for r, (row, seed) in enumerate(zip(ids, seeds)):
      tokens[r, :len(row)], lengths[r], seeds_arr[r] = row, len(row), seed

    def put(x):
      sh = NamedSharding(self.mesh, PartitionSpec(*tuple(self._batch_sh.spec)[:x.ndim]))
      return jax.make_array_from_callback(x.shape, sh, lambda idx: x[idx])
    return put(tokens), put(lengths), put(seeds_arr)

  def _run_chunk(self, ids, seeds) -> jax.Array:
    with jax.set_mesh(self.mesh):
      return self._fn(self.graphdef, self.params, *self._chunk_arrays(ids, seeds))

  def generate(self, ids: Sequence[Sequence[int]], seeds: Sequence[int],
               on_chunk: Callable[[int], None] | None = None) -> list[Completion]:
    """Completions for every prompt, on every host. `on_chunk(n_prompts)` reports progress."""
    b, n = self.ec.batch_size, len(ids)
    for i, row in enumerate(ids):
      if not 1 <= len(row) <= self.ec.max_prompt_len:
        raise ValueError(f"prompt {i} has {len(row)} tokens; prompts need 1..sample.max_prompt_len="
                         f"{self.ec.max_prompt_len} tokens (raise max_prompt_len)")
    chunks = [(ids[i:i + b], seeds[i:i + b]) for i in range(0, n, b)]
    if self.mode == "global":
      outs = []
      for c_ids, c_seeds in chunks:
        out = self._run_chunk(c_ids, c_seeds)
        outs.append(np.asarray(multihost_utils.process_allgather(out, tiled=True)))
        if on_chunk:
          on_chunk(len(c_ids))
      new = np.concatenate(outs) if outs else np.zeros((0, self.ec.max_new_tokens), np.int32)
    else:
      new = self._generate_replicated(chunks, on_chunk)
    return [engine.trim(new[i], self.stop_ids) for i in range(n)]

  def _generate_replicated(self, chunks, on_chunk) -> np.ndarray:
    hosts, me = jax.process_count(), jax.process_index()
    rounds = -(-len(chunks) // hosts)
    mine = np.full((rounds, self.ec.batch_size, self.ec.max_new_tokens), engine.NO_TOKEN, np.int32)
    for r in range(rounds):
      c = r * hosts + me
      if c < len(chunks):
        mine[r] = np.asarray(self._run_chunk(*chunks[c]))
      if on_chunk:  # the leader reports the whole round: every host works at the same pace
        on_chunk(sum(len(chunks[k][0]) for k in range(r * hosts, min((r + 1) * hosts, len(chunks)))))
    every = np.asarray(multihost_utils.process_allgather(mine)) if hosts > 1 else mine[None]
    order = every.transpose(1, 0, 2, 3).reshape(rounds * hosts * self.ec.batch_size, -1)  # chunk r*hosts+h
    return order
