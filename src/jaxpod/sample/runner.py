"""`PagedRunner`: the device side of the continuous engine for one mesh.

It owns the KV page pools (sharded like the model's kv heads, whole over the data axes,
since any slot may use any page), puts the scheduler's host arrays on the mesh (rows split
over the data axes), calls the compiled `steps` programs and brings the sampled tokens back
to this host (global mode with several processes: an all-gather of the fixed-shape token
array, so every host's scheduler sees the same tokens).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec

from jaxpod.models.llama.model import PAGE_AXES, Llama
from jaxpod.runtime.sharding import DEFAULT as DEFAULT_RULES
from jaxpod.sample import steps
from jaxpod.sample.config import EngineConfig, SamplingParams
from jaxpod.sample.scheduler import decode_page_buckets


class PagedRunner:
  """Pools + compiled prefill/decode for one model on one mesh (global: all devices; replicated: local)."""

  def __init__(self, model: Llama, mesh, ec: EngineConfig, sp: SamplingParams, stop_ids: tuple[int, ...],
               global_mode: bool):
    (self.graphdef, self.params), self.mesh, self.ec, self.sp = nnx.split(model), mesh, ec, sp
    self.stop_ids, self.global_mode = stop_ids, global_mode
    cfg = model.cfg
    shape = (cfg.num_hidden_layers, ec.pool_pages, ec.page_size, cfg.num_key_value_heads, cfg.head_dim_)
    pool_sh = NamedSharding(mesh, DEFAULT_RULES.fitted_spec(PAGE_AXES, shape, mesh, "kv_pool"))
    zeros = jax.jit(lambda: jnp.zeros(shape, cfg.jnp_dtype), out_shardings=pool_sh)
    with jax.set_mesh(mesh):  # the caller's context mesh may be another one (a trainer's global mesh)
      self.k, self.v = zeros(), zeros()
    self._rows = DEFAULT_RULES.spec(("batch",), mesh)[0]

  def _put(self, x: np.ndarray):
    sh = NamedSharding(self.mesh, PartitionSpec(self._rows, *([None] * (x.ndim - 1))))
    return jax.make_array_from_callback(x.shape, sh, lambda idx: x[idx])

  def _host(self, x) -> np.ndarray:
    if self.global_mode and jax.process_count() > 1:
      return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)

  def prefill(self, tokens_RxP, lengths_R, table_RxM, seeds_R, samples_RxN, copy_src_C, copy_dst_C) -> np.ndarray:
    fn = steps.compiled("prefill", self.global_mode, sp=self.sp)
    rows = [self._put(x) for x in (tokens_RxP, lengths_R, table_RxM, seeds_R, samples_RxN)]
    whole = NamedSharding(self.mesh, PartitionSpec())
    copies = [jax.make_array_from_callback(x.shape, whole, lambda i, x=x: x[i]) for x in (copy_src_C, copy_dst_C)]
    with jax.set_mesh(self.mesh):
      self.k, self.v, first = fn(self.graphdef, self.params, self.k, self.v, *rows, *copies)
    return self._host(first)

  def decode(self, table_BxM, tok_B, pos_B, gen_B, limit_B, seeds_B, samples_B, live_B, kv_len: int) -> np.ndarray:
    fn = steps.compiled("decode", self.global_mode, sp=self.sp, stop_ids=self.stop_ids,
                        steps=self.ec.steps_per_round, kv_len=kv_len)
    rows = [self._put(x) for x in (table_BxM, tok_B, pos_B, gen_B, limit_B, seeds_B, samples_B, live_B)]
    with jax.set_mesh(self.mesh):
      self.k, self.v, out = fn(self.graphdef, self.params, self.k, self.v, *rows)
    return self._host(out)

  def warmup(self, n: int = 1) -> int:
    """Compile every prefill bucket and every decode KV length once (all writes to scratch); returns programs."""
    ec, r, b, m = self.ec, self.ec.prefill_rows, self.ec.batch_size, self.ec.pages_per_seq
    c = max(1, r * (n - 1))
    count = 0
    for bucket in ec.prefill_buckets():
      self.prefill(np.zeros((r, bucket), np.int32), np.ones((r,), np.int32), np.zeros((r, m), np.int32),
                   np.zeros((r,), np.uint32), np.zeros((r, n), np.int32), np.zeros((c,), np.int32),
                   np.zeros((c,), np.int32))
      count += 1
    for pages in decode_page_buckets(m):
      z = np.zeros((b,), np.int32)
      self.decode(np.zeros((b, m), np.int32), z, z, z, z, z.astype(np.uint32), z, z.astype(bool),
                  pages * ec.page_size)
      count += 1
    return count

