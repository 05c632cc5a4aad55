"""The capture forward: bit-identical activations on any (data, fsdp, model) mesh.

A sharded matmul sums in an order that depends on the mesh (a `model` axis splits the
contraction; a different rows-per-device count picks a different kernel), so the same
prompt would give different last bits on different layouts. Here every device runs each of
its rows alone (`lax.map` over rows, batch 1) with whole weights inside a `shard_map`: the
per-row program is the same on every layout, and so are the bytes.

Rows are spread over every mesh axis when the batch divides the device count; otherwise
over data*fsdp, replicated over `model` (the writer keeps replica 0). Weights stay sharded
at rest (fsdp/model) and are gathered for the forward.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec as P, use_abstract_mesh

from jaxpod import runtime
from jaxpod.extract.config import ExtractConfig
from jaxpod.models.llama import model as model_lib


def row_axes(mesh, batch_size: int) -> tuple[str, ...]:
  """Mesh axes the batch rows are split over."""
  if batch_size % mesh.devices.size == 0:
    return tuple(mesh.axis_names)
  return ("data", "fsdp")


class Forward:
  """`Forward(model, mesh, cfg)(tokens_BxT, mask_BxT) -> {"resid.4": [B, T, D] jax.Array, ...}`."""

  def __init__(self, model: model_lib.Llama, mesh, cfg: ExtractConfig):
    self.mesh, self.cfg = mesh, cfg
    self.graphdef, self.params = nnx.split(model)
    rows = row_axes(mesh, cfg.batch_size)
    self.in_sharding = NamedSharding(mesh, P(rows))
    self._fn = runtime.jit(self._build(rows), name="extract.forward")

  def _build(self, rows: tuple[str, ...]):
    graphdef, cfg = self.graphdef, self.cfg
    layers, points, keys, dtype = tuple(sorted(cfg.layers)), tuple(cfg.points), cfg.keys, jnp.dtype(cfg.np_dtype)

    def one_row(params, tokens_T, mask_T):
      with use_abstract_mesh(AbstractMesh((), ())):  # whole weights here: no sharding constraints
        out = model_lib.forward(graphdef, params, tokens_T[None], kv_mask_BxS=mask_T[None], capture_layers=layers,
                                capture_points=points, return_hidden=True)
      return {k: out.captures[k][0].astype(dtype) for k in keys}  # each [T, D]

    def per_device(params, tokens_bxT, mask_bxT):
      return jax.lax.map(lambda tm: one_row(params, *tm), (tokens_bxT, mask_bxT))

    return jax.shard_map(per_device, mesh=self.mesh, in_specs=(P(), P(rows), P(rows)), out_specs=P(rows),
                         check_vma=False)

  def _global(self, x: np.ndarray) -> jax.Array:
    """A global array from a value every host holds whole (each host fills its own devices)."""
    return jax.make_array_from_callback(x.shape, self.in_sharding, lambda idx: x[idx])

  def __call__(self, tokens_BxT: np.ndarray, mask_BxT: np.ndarray) -> dict[str, jax.Array]:
    return self._fn(self.params, self._global(tokens_BxT), self._global(mask_BxT))
