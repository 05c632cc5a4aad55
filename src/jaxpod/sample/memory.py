"""Device memory of the engines next to a train state, checked before anything is compiled.

    kv = kv_cache_bytes(cfg, ec, mesh)                       # one engine's KV cache, bytes per device
    w = engine_weight_bytes(cfg, mesh)                       # its weights in the inference layout, per device
    check_device_memory({"train_state": t, "rollout kv_cache": kv}, {"train_state": "...", ...}, available)
    check_train_and_engines(tree_bytes_per_device(state), [EngineMemory("rollout", kv, w, engine_knob(...))])

`check_device_memory` is the one comparison (parts in bytes per device against `fraction` of a
device's memory) and names the knob of the largest part in one line; `jaxpod sample`'s
`check_memory` and a trainer with colocated engines (`check_train_and_engines`) both go through it.
"""
from __future__ import annotations

import math
from typing import Mapping, NamedTuple, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding

from jaxpod.models.llama.config import LlamaConfig
from jaxpod.models.llama.kv import PAGE_AXES, SLOT_AXES
from jaxpod.runtime.mesh import data_parallel, device_memory_bytes
from jaxpod.runtime.sharding import DEFAULT, INFERENCE, state_shardings
from jaxpod.sample.config import EngineConfig


def _per_device(shape, dtype, sharding) -> int:
  return math.prod(sharding.shard_shape(tuple(shape))) * np.dtype(dtype).itemsize


def data_shards(mesh) -> int:
  """N: the mesh's data-parallel size (data x fsdp), the number of page pools."""
  return data_parallel(mesh)


def pool_shape(cfg: LlamaConfig, ec: EngineConfig, mesh) -> tuple[int, ...]:
  """The paged engine's pool [L, N, P, page_size, K, E]: a pool of P pages per data shard."""
  n = data_shards(mesh)
  return (cfg.num_hidden_layers, n, ec.shard_pages(n), ec.page_size, cfg.num_key_value_heads, cfg.head_dim_)


def kv_cache_bytes(cfg: LlamaConfig, ec: EngineConfig, mesh) -> int:
  """One engine's KV cache, bytes per device: its data shard's page pools (k and v), or the slots at full capacity."""
  if ec.kv_layout == "paged":
    shape = pool_shape(cfg, ec, mesh)
    return 2 * _per_device(shape, cfg.dtype, NamedSharding(mesh, DEFAULT.fitted_spec(PAGE_AXES, shape, mesh,
                                                                                      "kv_pool")))
  shape = (ec.batch_size, cfg.num_key_value_heads, ec.cache_len, cfg.head_dim_)
  sh = NamedSharding(mesh, DEFAULT.fitted_spec(SLOT_AXES, shape, mesh, "kv_slots"))
  return 2 * cfg.num_hidden_layers * _per_device(shape, cfg.dtype, sh)


def engine_weight_bytes(cfg: LlamaConfig, mesh) -> int:
  """The engine's weights in the inference layout (replicated over data and fsdp, split over model), per device."""
  from jaxpod.models.llama.model import abstract
  _, abs_state = nnx.split(abstract(cfg))
  shardings = state_shardings(abs_state, mesh, INFERENCE)
  return sum(_per_device(v.shape, v.dtype, s) for v, s in zip(jax.tree.leaves(abs_state), jax.tree.leaves(shardings)))


def tree_bytes_per_device(tree, shardings=None) -> int:
  """Bytes one device holds of a tree (e.g. a train state): arrays by their own sharding, abstract leaves
  (ShapeDtypeStruct) by the matching leaf of `shardings`."""
  leaves = jax.tree.leaves(tree)
  shs = jax.tree.leaves(shardings) if shardings is not None else [getattr(x, "sharding", None) for x in leaves]
  return sum(_per_device(x.shape, x.dtype, s) if s is not None else math.prod(x.shape) * np.dtype(x.dtype).itemsize
             for x, s in zip(leaves, shs))


def check_device_memory(parts: Mapping[str, int], knobs: Mapping[str, str], available: int | None = None,
                        fraction: float = 1.0, what: str = "memory check") -> dict[str, int]:
  """`parts` (bytes per device) if their sum fits `fraction` of `available` (default: this device's memory);
  otherwise a one-line ValueError giving every part and the knob (`knobs[name]`) of the largest."""
  total = sum(parts.values())
  limit = int((available or device_memory_bytes()) * fraction)
  if total <= limit:
    return dict(parts)
  worst = max(parts, key=parts.get)
  listed = " + ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in parts.items())
  raise ValueError(f"{what}: {listed} = {total / 2**20:.1f} MiB per device exceeds {limit / 2**20:.1f} MiB "
                   f"(memory_fraction={fraction} of the device); the largest part is {worst}: "
                   f"{knobs.get(worst, 'make it smaller')}")


class EngineMemory(NamedTuple):
  """One engine next to the train state: its KV cache and its own weight copy, bytes per device, and what to lower."""

  name: str  # e.g. "rollout", "eval"
  kv_cache: int  # `kv_cache_bytes(cfg, engine_config, mesh)`
  weights: int  # `engine_weight_bytes(cfg, mesh)`, or 0 where the engine reads the train state's arrays as they are
  knob: str  # e.g. "lower rl.rollout.batch_size=128 or rl.rollout.max_new_tokens=512"


def engine_knob(section: str, ec: EngineConfig, batch_field: str = "batch_size") -> str:
  """What shrinks an engine's KV cache, with the values it has now."""
  pages = f" or {section}.num_pages={ec.num_pages}" if ec.kv_layout == "paged" and ec.num_pages else ""
  return (f"lower {section}.{batch_field}={ec.batch_size} or {section}.max_new_tokens={ec.max_new_tokens} "
          f"(+ max_prompt_len={ec.max_prompt_len}: {ec.cache_len} tokens per sequence){pages}, or raise "
          f"--mesh.data/--mesh.fsdp (the KV cache splits over data shards)")


def check_train_and_engines(train_state: int, engines: Sequence[EngineMemory], available: int | None = None,
                            fraction: float = 0.9, what: str = "rl memory check") -> dict[str, int]:
  """The train state plus every engine's KV cache and weight copy (bytes per device) against device memory; one
  line naming the knob of the largest part if they do not fit."""
  parts, knobs = {"train_state": int(train_state)}, {
      "train_state": "shard the train state more (raise --mesh.fsdp, or --mesh.model) or use a smaller model / dtype"}
  for e in engines:
    parts[f"{e.name} kv_cache"], knobs[f"{e.name} kv_cache"] = int(e.kv_cache), e.knob
    if e.weights:
      parts[f"{e.name} weights"] = int(e.weights)
      knobs[f"{e.name} weights"] = ("the engine's weight copy (inference layout: whole over data and fsdp) is "
                                    "split only by --mesh.model: raise --mesh.model")
  return check_device_memory(parts, knobs, available, fraction, what)
