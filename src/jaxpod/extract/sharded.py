"""The sharded capture forward: the model's own Llama forward at full batch, weights left sharded.

The same `models.llama` blocks that sampling and training run, jitted once over the whole
global batch with the model's logical-axis annotations (runtime/sharding.py): rows split over
data*fsdp, heads/mlp/vocab over `model` (tensor parallelism), weight hidden dims over `fsdp`.
The model's blocks are a stacked module ([L, ...] weights, each still sharded; `models/llama/stack.py`): a
loop runs block i on slice i, so XLA gathers one block's fsdp shards per iteration: a device holds its shard of
every weight plus about one block gathered. (With the blocks unrolled, XLA CPU gathered every block up front: temp
memory > the whole weights at fsdp=8.) The loop stops after the last captured block (`Llama(..., stop_at=)`).
Captures come out [B, T, D] sharded over data*fsdp (replicated over `model`; the writer keeps replica 0).

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

from jaxpod import runtime
from jaxpod.extract.config import ExtractConfig
from jaxpod.models.llama import model as model_lib
from jaxpod.runtime.sharding import DEFAULT as DEFAULT_RULES, constrain

# max|a - b| / max|b| per captured tensor across meshes, by compute dtype (see module docstring)
TOLERANCE = {"float32": 1e-5, "bfloat16": 2e-2}
ROWS = ("batch", "seq")  # logical axes of the model inputs
ACT = ("batch", "seq", "act_embed")  # logical axes of every capture: rows over data*fsdp, hidden whole


class ShardedForward:
  """`ShardedForward(model, mesh, cfg)(tokens_BxT, mask_BxT) -> {"resid.4": [B, T, D] jax.Array, ...}`."""

  def __init__(self, model: model_lib.Llama, mesh, cfg: ExtractConfig):
    self.mesh, self.cfg = mesh, cfg
    self.graphdef, self.params = nnx.split(model)  # no final norm nor LM head runs (stop_at: the last capture)
    self.in_sharding = DEFAULT_RULES.sharding(mesh, ROWS)
    out = DEFAULT_RULES.sharding(mesh, ACT)
    self._fn = runtime.jit(self._build(), name="extract.sharded_forward",
                           out_shardings={k: out for k in cfg.keys})

  def _build(self):
    graphdef, cfg = self.graphdef, self.cfg
    layers, points, dtype = tuple(sorted(cfg.layers)), tuple(cfg.points), jnp.dtype(cfg.np_dtype)

    def fn(params, tokens_BxT, mask_BxT):
      out = model_lib.forward(graphdef, params, tokens_BxT, kv_mask_BxS=mask_BxT, capture_layers=layers,
                              capture_points=points, stop_at=max(layers))
      return {k: constrain(v, ACT).astype(dtype) for k, v in out.captures.items()}

    return fn

  def _global(self, x: np.ndarray) -> jax.Array:
    """A global array from a value every host holds whole (each host fills its own devices)."""
    return jax.make_array_from_callback(x.shape, self.in_sharding, lambda idx: x[idx])

  def __call__(self, tokens_BxT: np.ndarray, mask_BxT: np.ndarray) -> dict[str, jax.Array]:
    return self._fn(self.params, self._global(tokens_BxT), self._global(mask_BxT))
