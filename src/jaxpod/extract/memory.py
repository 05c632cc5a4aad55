"""The extraction memory plan: per-device bytes checked before anything compiles.

    plan = memory_plan(model_cfg, cfg, mesh, seq_len)   # {"weights": ..., "gathered": ..., ...}
    check_memory(model_cfg, cfg, mesh, seq_len)         # raises naming the knob to turn

Parts (estimates of the peak, per device):
  weights      parameters at rest, as `runtime.state_shardings` places them on this mesh
  gathered     sharded: one block and the embedding with their fsdp shards gathered (the loop over
               blocks gathers one block per iteration; XLA's temp bytes measured below this)
               exact: every weight whole (the exact path gathers them all into each device)
  activations  one block's live tensors (residual, q/k/v/ctx, the mlp pair, fp32 scores + probs)
               for the rows one device runs at once (sharded: batch / (data*fsdp); exact: one row)
  captures     every captured [rows, T, D] tensor, in the compute dtype (and the stored one if it differs)
"""
from __future__ import annotations

import math

import jax
import numpy as np
from flax import nnx

from jaxpod.extract.config import ExtractConfig
from jaxpod.models.llama import model as model_lib
from jaxpod.models.llama.config import LlamaConfig
from jaxpod.runtime.mesh import data_parallel, device_memory_bytes
from jaxpod.runtime.sharding import DEFAULT as DEFAULT_RULES, state_shardings


def _bytes(state, mesh, rules) -> int:
  """Per-device bytes of an abstract NNX state placed on `mesh` by `rules`."""
  shardings = state_shardings(state, mesh, rules)
  return sum(math.prod(s.shard_shape(tuple(v.shape))) * np.dtype(v.dtype).itemsize
             for v, s in zip(jax.tree.leaves(state), jax.tree.leaves(shardings)))


def memory_plan(mc: LlamaConfig, cfg: ExtractConfig, mesh, seq_len: int) -> dict[str, int]:
  """Estimated bytes per device of weights, gathered weights, activations and captures."""
  _, state = nnx.split(model_lib.abstract(mc))
  weights = _bytes(state, mesh, DEFAULT_RULES)
  item, stored = np.dtype(mc.dtype).itemsize, np.dtype(cfg.np_dtype).itemsize
  d, h, e, i = mc.hidden_size, mc.num_attention_heads, mc.head_dim_, mc.intermediate_size
  dp = data_parallel(mesh)
  if cfg.forward == "exact":
    whole = sum(math.prod(v.shape) * np.dtype(v.dtype).itemsize for v in jax.tree.leaves(state))
    rows_live, model = 1, 1
    rows_kept = cfg.batch_size // (mesh.devices.size if cfg.batch_size % mesh.devices.size == 0 else dp)
    gathered = whole
  else:
    rows_live = rows_kept = cfg.batch_size // dp
    model = mesh.shape["model"]
    no_fsdp = DEFAULT_RULES.replace(embed=None)  # what a block looks like once its fsdp shards are gathered
    gathered = _bytes(state["layers"], mesh, no_fsdp) // mc.num_hidden_layers + _bytes(state["embed_tokens"], mesh,
                                                                                        no_fsdp)  # one block
  t = seq_len
  acts = rows_live * t * (4 * d + 2 * h * e // model + 2 * i // model) * item
  acts += 2 * rows_live * max(1, h // model) * t * t * 4
  captures = rows_kept * t * d * len(cfg.keys) * (item + (stored if stored != item else 0))
  return {"weights": weights, "gathered": gathered, "activations": acts, "captures": captures}


def check_memory(mc: LlamaConfig, cfg: ExtractConfig, mesh, seq_len: int,
                 available: int | None = None) -> dict[str, int]:
  """The plan, or a one-line error naming the largest part and the option that shrinks it."""
  plan = memory_plan(mc, cfg, mesh, seq_len)
  total = sum(plan.values())
  device = available or cfg.device_memory_bytes or device_memory_bytes()
  limit = int(device * cfg.memory_fraction)
  if total <= limit:
    return plan
  fsdp, model = mesh.shape["fsdp"], mesh.shape["model"]
  shard = (f"shard the weights over more devices: raise --mesh.fsdp / --mesh.model (now fsdp={fsdp}, model={model})"
           if cfg.forward == "sharded" else
           "use --forward sharded with --mesh.fsdp x --mesh.model > 1 (the exact path holds every weight whole)")
  knobs = {
      "weights": shard, "gathered": shard,
      "activations": f"lower --batch_size={cfg.batch_size} or --max_seq_len={cfg.max_seq_len}",
      "captures": f"capture fewer layers/points (--layers, --points: {len(cfg.keys)} tensors) or lower "
                  f"--batch_size={cfg.batch_size}",
  }
  worst = max(plan, key=plan.get)
  parts = " + ".join(f"{k} {v / 2**20:.2f} MiB" for k, v in plan.items())
  raise ValueError(f"extract memory plan ({cfg.forward} forward): {parts} = {total / 2**20:.2f} MiB per device "
                   f"exceeds {limit / 2**20:.2f} MiB (memory_fraction={cfg.memory_fraction} of "
                   f"{device / 2**20:.2f} MiB, extract.device_memory_bytes); the largest part is {worst}: "
                   f"{knobs[worst]}")
