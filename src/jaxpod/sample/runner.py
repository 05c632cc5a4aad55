"""`PagedRunner`: the device side of the continuous engine for one mesh.

It owns the KV page pools (sharded like the model's kv heads, whole over the data axes,
since any slot may use any page), puts the scheduler's host arrays on the mesh (rows split
over the data axes), calls the compiled `steps` programs and brings the sampled tokens back
to this host (global mode with several processes: an all-gather of the fixed-shape token
and log-prob arrays, so every host's scheduler sees the same tokens).

It also holds the weights and their version label: `update_params` swaps in new arrays of
the same tree, shapes, dtypes and shardings, so the compiled programs are reused as they are.
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
               global_mode: bool, version: int = 0):
    (self.graphdef, self.params), self.mesh, self.ec, self.sp = nnx.split(model), mesh, ec, sp
    self.version = version
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

  def _host(self, *xs) -> tuple[np.ndarray, ...]:
    if self.global_mode and jax.process_count() > 1:
      return tuple(np.asarray(x) for x in multihost_utils.process_allgather(xs, tiled=True))
    return tuple(np.asarray(x) for x in xs)

  def update_params(self, params, version: int) -> None:
    """New weights (same tree, shapes, dtypes, shardings: no recompilation) labelled `version`."""
    self.params = same_layout(self.params, params)
    self.version = int(version)

  def prefill(self, tokens_RxP, lengths_R, table_RxM, seeds_R, row_D, sample_D, copy_src_D, copy_dst_D):
    """(first tokens [D], their log-probs [D]) on this host."""
    fn = steps.compiled("prefill", self.global_mode, sp=self.sp)
    rows = [self._put(x) for x in (tokens_RxP, lengths_R, table_RxM, seeds_R)]
    whole = NamedSharding(self.mesh, PartitionSpec())
    rest = [jax.make_array_from_callback(x.shape, whole, lambda i, x=x: x[i])
            for x in (row_D, sample_D, copy_src_D, copy_dst_D)]
    with jax.set_mesh(self.mesh):
      self.k, self.v, first, logp = fn(self.graphdef, self.params, self.k, self.v, *rows, *rest)
    return self._host(first, logp)

  def decode(self, table_BxM, tok_B, pos_B, gen_B, limit_B, seeds_B, samples_B, live_B, kv_len: int):
    """(tokens [B, steps], their log-probs [B, steps]) on this host."""
    fn = steps.compiled("decode", self.global_mode, sp=self.sp, stop_ids=self.stop_ids,
                        steps=self.ec.steps_per_round, kv_len=kv_len)
    rows = [self._put(x) for x in (table_BxM, tok_B, pos_B, gen_B, limit_B, seeds_B, samples_B, live_B)]
    with jax.set_mesh(self.mesh):
      self.k, self.v, out, logp = fn(self.graphdef, self.params, self.k, self.v, *rows)
    return self._host(out, logp)

  def warmup(self) -> int:
    """Compile every prefill bucket and every decode KV length once (all writes to scratch); returns programs."""
    ec, r, b, m = self.ec, self.ec.prefill_rows, self.ec.batch_size, self.ec.pages_per_seq
    z = np.zeros((b,), np.int32)
    count = 0
    for bucket in ec.prefill_buckets():
      self.prefill(np.zeros((r, bucket), np.int32), np.ones((r,), np.int32), np.zeros((r, m), np.int32),
                   np.zeros((r,), np.uint32), z, z, z, z)
      count += 1
    for pages in decode_page_buckets(m):
      self.decode(np.zeros((b, m), np.int32), z, z, z, z, z.astype(np.uint32), z, z.astype(bool),
                  pages * ec.page_size)
      count += 1
    return count


def same_layout(old, new):
  """`new` if it has `old`'s tree, shapes, dtypes and shardings (equivalent shardings are re-placed as `old`'s);
  otherwise a one-line ValueError naming the first leaf that differs and how."""
  name = lambda path: jax.tree_util.keystr(path, simple=True, separator=".")  # noqa: E731
  old_leaves, old_def = jax.tree_util.tree_flatten_with_path(old)
  new_leaves, new_def = jax.tree_util.tree_flatten_with_path(new)
  if old_def != new_def:
    old_names, new_names = [name(p) for p, _ in old_leaves], [name(p) for p, _ in new_leaves]
    first = next((i for i, (a, b) in enumerate(zip(old_names, new_names)) if a != b), min(len(old_names),
                                                                                              len(new_names)))
    got = new_names[first] if first < len(new_names) else "nothing"
    want = old_names[first] if first < len(old_names) else "nothing"
    raise ValueError(f"update_params: the parameter tree differs from the sampler's: leaf {first} is {got}, "
                     f"expected {want} ({len(new_names)} leaves given, {len(old_names)} expected); pass the "
                     f"same model's parameters (nnx.split(model)[1])")
  out = []
  for (path, a), (_, b) in zip(old_leaves, new_leaves):
    what = None
    if tuple(a.shape) != tuple(b.shape):
      what = f"shape {tuple(b.shape)}, expected {tuple(a.shape)}"
    elif a.dtype != b.dtype:
      what = f"dtype {b.dtype}, expected {a.dtype}"
    elif not isinstance(b, jax.Array):
      what = f"a {type(b).__name__}, expected a jax.Array placed as {a.sharding}"
    elif b.sharding != a.sharding:
      if not b.sharding.is_equivalent_to(a.sharding, a.ndim):
        what = f"sharding {b.sharding}, expected {a.sharding}"
      else:
        b = jax.device_put(b, a.sharding)  # the same placement spelled differently: keep the compiled programs
    if what:
      raise ValueError(f"update_params: parameter {name(path)} has {what}; new weights must match the "
                       f"sampler's tree, shapes, dtypes and shardings (a different layout would recompile)")
    out.append(b)
  return jax.tree_util.tree_unflatten(old_def, out)
