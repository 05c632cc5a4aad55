"""The sharded capture forward: the model's own Llama forward at full batch, weights left sharded.

The same `models.llama` blocks that sampling and training run, jitted once over the whole
global batch with the model's logical-axis annotations (runtime/sharding.py): rows split over
data*fsdp, heads/mlp/vocab over `model` (tensor parallelism), weight hidden dims over `fsdp`.
The blocks' weights are stacked once ([L, ...], each still sharded) and a `fori_loop` runs
block i on slice i, so XLA gathers one block's fsdp shards per iteration: a device holds its
shard of every weight plus about one block gathered. (With the blocks unrolled, XLA CPU
gathered every block up front: temp memory > the whole weights at fsdp=8.) The loop stops
after the last captured block. Captures come out [B, T, D] sharded over data*fsdp
(replicated over `model`; the writer keeps replica 0).

Numerics: on a fixed mesh the program is fixed, so a rerun or a resume gives the same bytes.
Across meshes the sums split differently (a `model` axis splits a contraction, another
rows-per-device count picks another kernel) and the last bits differ. `TOLERANCE` bounds
max|a - b| / max|b| per captured tensor (b: the exact path, or another mesh). Measured on the
test model (3 blocks, hidden 64, GQA 4/2; resid/attn_out/mlp_out of blocks 0 and 2, 21
prompts) on data=8, data=4 x model=2 and fsdp=2 x model=4 vs the exact path: float32
<= 8.9e-7 (data=8: byte-identical), bfloat16 model <= 1.2e-2, the size of bfloat16 itself
(the exact bf16 path vs float32 differs by up to 1.3e-2). `extract.forward` is the exact path.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxpod import runtime
from jaxpod.extract.config import ExtractConfig
from jaxpod.models.llama import model as model_lib
from jaxpod.runtime.sharding import DEFAULT as DEFAULT_RULES, constrain, state_shardings

# max|a - b| / max|b| per captured tensor across meshes, by compute dtype (see module docstring)
TOLERANCE = {"float32": 1e-5, "bfloat16": 2e-2}
ROWS = ("batch", "seq")  # logical axes of the model inputs
ACT = ("batch", "seq", "act_embed")  # logical axes of every capture: rows over data*fsdp, hidden whole
BUFFER = (None, "batch", "seq", "act_embed")  # a stack of captures [slots, B, T, D]


def stack_blocks(model: model_lib.Llama, mesh, consume: bool = False):
  """(block graphdef, one State whose leaves are the blocks' weights stacked [L, ...], sharded as one block's).

  consume: free each block weight once stacked (the model's blocks are unusable after), so loading
  peaks at the sharded weights plus one weight kind of every block, not twice the weights.
  """
  block_def, first = nnx.split(model.layers[0])
  treedef = jax.tree.structure(first)
  shardings = jax.tree.leaves(state_shardings(first, mesh))
  per_block = [jax.tree.leaves(nnx.split(b)[1]) for b in model.layers]
  stacked = []
  for j, sh in enumerate(shardings):
    to = NamedSharding(mesh, P(None, *sh.spec))
    stacked.append(jax.jit(lambda *xs: jnp.stack(xs), out_shardings=to)(*[leaves[j] for leaves in per_block]))
    if consume:
      jax.block_until_ready(stacked[-1])
      for leaves in per_block:
        leaves[j].delete()
  return block_def, jax.tree.unflatten(treedef, stacked)


class ShardedForward:
  """`ShardedForward(model, mesh, cfg)(tokens_BxT, mask_BxT) -> {"resid.4": [B, T, D] jax.Array, ...}`."""

  def __init__(self, model: model_lib.Llama, mesh, cfg: ExtractConfig, consume: bool = False):
    """consume: free the model's block weights as they are stacked (see `stack_blocks`)."""
    self.mesh, self.cfg, self.model_cfg = mesh, cfg, model.cfg
    self.block_def, blocks = stack_blocks(model, mesh, consume)
    self.params = (model.embed_tokens[...], blocks)  # what the forward reads: no final norm, no LM head
    self.in_sharding = DEFAULT_RULES.sharding(mesh, ROWS)
    out = DEFAULT_RULES.sharding(mesh, ACT)
    self._fn = runtime.jit(self._build(), name="extract.sharded_forward",
                           out_shardings={k: out for k in cfg.keys})

  def _build(self):
    block_def, cfg, mc = self.block_def, self.cfg, self.model_cfg
    layers, points, dtype = tuple(sorted(cfg.layers)), tuple(cfg.points), jnp.dtype(cfg.np_dtype)
    # slot of block i in the capture buffers; blocks not captured write the spare last slot
    slots = np.full((max(layers) + 1,), len(layers), np.int32)
    slots[list(layers)] = np.arange(len(layers))

    def fn(params, tokens_BxT, mask_BxT):
      embed, blocks = params
      b, t = tokens_BxT.shape
      x = model_lib.embed(mc, embed, tokens_BxT)  # as Llama.__call__
      positions = jnp.broadcast_to(jnp.arange(t), (b, t))
      inv_freq_LxE2, window_L = model_lib.layer_tables(mc)  # per layer: sliding and full layers differ
      bufs = {p: constrain(jnp.zeros((len(layers) + 1, *x.shape), x.dtype), BUFFER) for p in points}

      def body(i, carry):
        x, bufs = carry
        block = nnx.merge(block_def, jax.tree.map(lambda w: jax.lax.dynamic_index_in_dim(w, i, keepdims=False),
                                                  blocks))
        x, _, attn_out, mlp_out = block(x, positions, mask_BxT, None, 0, 0,
                                         model_lib.rope_tables(positions, inv_freq_LxE2[i]), window=window_L[i])
        got = {"resid": x, "attn_out": attn_out, "mlp_out": mlp_out}
        slot = jnp.asarray(slots)[i]
        bufs = {p: constrain(jax.lax.dynamic_update_index_in_dim(bufs[p], got[p].astype(x.dtype), slot, 0), BUFFER)
                for p in points}
        return x, bufs

      _, bufs = jax.lax.fori_loop(0, len(slots), body, (x, bufs))
      return {f"{p}.{i}": bufs[p][n].astype(dtype) for n, i in enumerate(layers) for p in points}

    return fn

  def _global(self, x: np.ndarray) -> jax.Array:
    """A global array from a value every host holds whole (each host fills its own devices)."""
    return jax.make_array_from_callback(x.shape, self.in_sharding, lambda idx: x[idx])

  def __call__(self, tokens_BxT: np.ndarray, mask_BxT: np.ndarray) -> dict[str, jax.Array]:
    return self._fn(self.params, self._global(tokens_BxT), self._global(mask_BxT))
