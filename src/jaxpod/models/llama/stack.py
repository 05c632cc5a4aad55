"""The decoder's layer stack: its blocks stored as one module of [L, ...] weights and run by a scan.

    layers = stack_modules([Block(cfg, rngs=rngs) for _ in range(L)])   # every weight [L, ...], axis "layers" first
    x, captures = run(layers, cfg, x, positions, kv_mask, rope, ...)     # lax.scan over L: one block in the program
    engine = unstacked(model)                                            # the engine's form: a block per layer

Why a scan: a Python loop over blocks puts L copies of the block in the program, so compile time and the
compiler's work grow with depth (Llama-3-8B's train step: 2 layers ~80 s, 32 layers 235 s for v5p); the scanned
program holds one block whatever L. Activations kept for the backward pass follow `LlamaConfig.remat`: `none`
keeps what XLA keeps, `full` only each block's input (the block is recomputed in the backward pass), `dots` the
outputs of the weight matmuls, `offload` those moved to host memory (`jax.checkpoint_policies`).

Layers of two kinds (sliding and full attention: Gemma 3, Qwen2's max_window_layers, Mistral) run in the same scan:
each layer reads its window and RoPE table from per-layer arrays.

The engine keeps a block per layer (`unstacked`): its KV caches are updated in place per layer, and on XLA:CPU
a decode step over separate per-layer weights ran 1.6x faster than a scan over the stacked weights (8 layers of
a 1024-wide MLP, batch 8: 11.5 vs 18.2 ms), because the scan copies each layer's slice before its matmuls.
"""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxpod.models.llama.config import LlamaConfig
from jaxpod.runtime.sharding import constrain

LAYERS_AXIS = "layers"
NO_WINDOW = 2 ** 30  # a traced layer window that hides nothing (a full-attention layer among sliding ones)
CAPTURE_BUFFER = (None, "batch", "seq", "act_embed")  # captures of the scanned layers [slots, B, T, D]


def remat_policy(name: str):
  """The `jax.checkpoint` policy of `LlamaConfig.remat` (None: no rematerialisation)."""
  policies = jax.checkpoint_policies
  return {"none": None, "full": policies.nothing_saveable, "dots": policies.dots_with_no_batch_dims_saveable,
          "offload": policies.offload_dot_with_no_batch_dims("device", "pinned_host")}[name]


def stack_modules(modules: Sequence[nnx.Module]) -> nnx.Module:
  """One module of the same structure whose every variable holds the modules' values stacked [L, ...], its logical
  axes led by `layers` (the modules were built in order, so their random draws are those of a loop over them)."""
  graphdef, _ = nnx.split(modules[0])
  states = [nnx.split(m)[1] for m in modules]
  stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *states)
  return nnx.merge(graphdef, nnx.from_flat_state([(p, _with_axes(v, v.get_value(), (LAYERS_AXIS,), 0))
                                                  for p, v in nnx.to_flat_state(stacked)]))


def is_stacked_path(path: tuple) -> bool:
  """Whether a model state path is a stacked block weight (`layers.<name>`, not the engine's `layers.<i>.<name>`)."""
  return path[0] == "layers" and not isinstance(path[1], int)


def without_layers_axis(var):
  """A stacked variable's metadata for one of its layers (logical axes without `layers`; the value unchanged)."""
  return _with_axes(var, var.get_value(), (), 1)


def _unstacked_block(state):
  """A stacked block's State with every variable's logical axes shorn of `layers` (values still [L, ...]): what a
  scan body sees, one layer's slice at a time."""
  return nnx.from_flat_state([(p, without_layers_axis(v)) for p, v in nnx.to_flat_state(state)])


def _with_axes(var, value, lead: tuple, drop: int):
  """`var` holding `value`, its logical axes with the first `drop` removed and `lead` put in front."""
  axes = var.get_metadata().get("logical_axes")
  return var.replace(value) if axes is None else var.replace(value, logical_axes=(*lead, *tuple(axes)[drop:]))


def is_stacked(layers) -> bool:
  """Whether a model's `layers` is the stacked block (not the engine's list of blocks)."""
  return not isinstance(layers, nnx.List)


def unstack_state(state, layers: int):
  """A model State with its stacked block weights (`layers.<name>` [L, ...]) split into `layers.<i>.<name>`: the
  engine's tree (pure: under jit the split runs on device; under eval_shape it allocates nothing)."""
  out = []
  for path, var in nnx.to_flat_state(state):
    if not is_stacked_path(path):
      out.append((path, var))
      continue
    value = var.get_value()
    out += [(("layers", i, *path[1:]), _with_axes(var, value[i], (), 1)) for i in range(layers)]
  return nnx.from_flat_state(out)


def engine_graphdef(model):
  """The graphdef of `model` with a block per layer (the engine's form; the model itself is left as it is)."""
  graphdef, state = nnx.split(model)
  if not is_stacked(model.layers):
    return graphdef
  n = model.cfg.num_hidden_layers

  def build():
    copy = nnx.merge(graphdef, state)
    block_def, block_state = nnx.split(copy.layers)
    block_state = _unstacked_block(block_state)
    copy.layers = nnx.List([nnx.merge(block_def, jax.tree.map(lambda w, i=i: w[i], block_state)) for i in range(n)])
    return copy
  return nnx.split(nnx.eval_shape(build))[0]


def unstacked(model):
  """A copy of `model` with a block per layer, each a slice of the stacked weights (eager: see
  `jaxpod.sample.layout.to_inference` for the split done on device into the engine's layout)."""
  if not is_stacked(model.layers):
    return model
  return nnx.merge(engine_graphdef(model), unstack_state(nnx.state(model), model.cfg.num_hidden_layers))


def layer_tables(cfg: LlamaConfig):
  """(sliding [L] bool, windows [L] int32 with NO_WINDOW for full layers) as numpy: what each layer reads in a scan."""
  local = np.array([cfg.window(i) is not None for i in range(cfg.num_hidden_layers)])
  windows = np.array([cfg.window(i) or NO_WINDOW for i in range(cfg.num_hidden_layers)], np.int32)
  return local, windows


def run(layers, cfg: LlamaConfig, x_BxTxD, positions_BxT, kv_mask_BxS, rope: dict, capture_layers: Sequence[int] = (),
        capture_points: Sequence[str] = (), stop_at: int | None = None):
  """(x after the last block run, {"resid.i": [B, T, D], ...}): the stacked blocks scanned over x.

  rope: `rope_tables` per kind ({False: full layers', True: sliding layers'}); stop_at: run blocks 0..stop_at only
  (a capture pass: a loop that indexes the stacked weights, so nothing is sliced off them)."""
  n_layers = cfg.num_hidden_layers
  block_def, state = nnx.split(layers)
  state = _unstacked_block(state)
  local_L, window_L = layer_tables(cfg)
  uniform = len(set(local_L.tolist())) == 1
  window = cfg.window(0) if uniform else None
  rope_K = None if uniform else tuple(jnp.stack([rope[False][j], rope[True][j]]) for j in range(2))  # [2, B, T, 1, E]
  slots = np.full((n_layers,), len(capture_layers), np.int32)  # layers not captured write the spare last slot
  slots[list(capture_layers)] = np.arange(len(capture_layers))
  bufs = {p: constrain(jnp.zeros((len(capture_layers) + 1, *x_BxTxD.shape), x_BxTxD.dtype), CAPTURE_BUFFER)
          for p in capture_points}

  def body(carry, layer_xs):
    x, bufs = carry
    block_state, i = layer_xs
    block = nnx.merge(block_def, block_state)
    if uniform:
      cs, win = rope[bool(local_L[0])], window
    else:
      kind = jnp.asarray(local_L, jnp.int32)[i]
      cs, win = tuple(t[kind] for t in rope_K), jnp.asarray(window_L)[i]
    x, _, attn_out, mlp_out = block(x, positions_BxT, kv_mask_BxS, None, 0, 0, cs, None, win)
    got = {"resid": x, "attn_out": attn_out, "mlp_out": mlp_out}
    slot = jnp.asarray(slots)[i]
    bufs = {p: constrain(jax.lax.dynamic_update_index_in_dim(b, got[p].astype(b.dtype), slot, 0), CAPTURE_BUFFER)
            for p, b in bufs.items()}
    return (x, bufs), None

  policy = remat_policy(cfg.remat)
  if policy is not None:
    body = jax.checkpoint(body, policy=policy, prevent_cse=False)
  with jax.named_scope("layers"):
    if stop_at is None:
      (x, bufs), _ = jax.lax.scan(body, (x_BxTxD, bufs), (state, jnp.arange(n_layers)))
    else:
      def step(i, carry):
        block_state = jax.tree.map(lambda w: jax.lax.dynamic_index_in_dim(w, i, keepdims=False), state)
        return body(carry, (block_state, i))[0]
      x, bufs = jax.lax.fori_loop(0, stop_at + 1, step, (x_BxTxD, bufs))
  captures = {f"{p}.{i}": bufs[p][n] for n, i in enumerate(capture_layers) for p in capture_points}
  return x, captures
