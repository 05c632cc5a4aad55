"""The device side of the continuous engine for one mesh: `PagedRunner` and `SlotRunner`.

A runner owns the KV cache of its layout, puts the scheduler's host arrays on the mesh
(rows split over the data axes), calls the compiled `steps` programs and brings the sampled
tokens and log-probs back to this host (global mode with several processes: an all-gather of
the fixed-shape arrays, so every host's scheduler sees the same tokens).

  PagedRunner  page pools [L, P, page_size, K, E], sharded like the model's kv heads and whole
               over the data axes (any row may use any page).
  SlotRunner   one [B, K, S, E] buffer per layer, slots split like the decode rows; the capacity
               S follows the scheduler's KV bucket (`resize`).

It also holds the weights and their version label: `update_params` swaps in new arrays of
the same tree, shapes, dtypes and shardings, so the compiled programs are reused as they are.
`device_s` adds up the wall time spent in device calls (the rest of a round is host-side work);
with `hlo` set to a list, programs are compiled ahead of time and their optimized HLO kept there
(`jaxpod bench sample` maps profiled ops to named scopes with it).
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec

from jaxpod.models.llama.model import PAGE_AXES, SLOT_AXES, Llama, PagedKVCache, SlotKVCache
from jaxpod.runtime.sharding import DEFAULT as DEFAULT_RULES
from jaxpod.sample import steps
from jaxpod.sample.config import EngineConfig, SamplingParams


class Runner:
  """Weights, version, and the host <-> mesh plumbing shared by both layouts."""

  def __init__(self, model: Llama, mesh, ec: EngineConfig, sp: SamplingParams, stop_ids: tuple[int, ...],
               global_mode: bool, version: int = 0):
    (self.graphdef, self.params), self.mesh, self.ec, self.sp = nnx.split(model), mesh, ec, sp
    self.cfg, self.version = model.cfg, version
    self.stop_ids, self.global_mode = stop_ids, global_mode
    self._rows = DEFAULT_RULES.spec(("batch",), mesh)[0]
    self.device_s = 0.0
    self.hlo: list[str] | None = None  # a list: profiling mode (programs compiled ahead of time, their HLO kept)
    self._compiled: dict = {}

  def _zeros(self, shape, logical, name: str):
    sh = NamedSharding(self.mesh, DEFAULT_RULES.fitted_spec(logical, shape, self.mesh, name))
    with jax.set_mesh(self.mesh):  # the caller's context mesh may be another one (a trainer's global mesh)
      return jax.jit(lambda: jnp.zeros(shape, self.cfg.jnp_dtype), out_shardings=sh)()

  def _put(self, x: np.ndarray):
    sh = NamedSharding(self.mesh, PartitionSpec(self._rows, *([None] * (x.ndim - 1))))
    return jax.make_array_from_callback(x.shape, sh, lambda idx: x[idx])

  def _whole(self, x: np.ndarray):
    return jax.make_array_from_callback(x.shape, NamedSharding(self.mesh, PartitionSpec()), lambda i: x[i])

  def _host(self, *xs) -> tuple[np.ndarray, ...]:
    if self.global_mode and jax.process_count() > 1:
      return tuple(np.asarray(x) for x in multihost_utils.process_allgather(xs, tiled=True))
    return tuple(np.asarray(x) for x in xs)

  def _call(self, kind: str, *args, **static):
    """Run program `kind` on the mesh (callers add their wall time, results on the host included, to `device_s`)."""
    fn = steps.compiled(kind, self.global_mode, **static)
    with jax.set_mesh(self.mesh):
      return fn(*args) if self.hlo is None else self._aot(fn, kind, args, static)

  def _aot(self, fn, kind: str, args, static):
    """Profiling: run an ahead-of-time compiled copy of the program and keep its optimized HLO (`self.hlo`)."""
    dynamic = args[1:] if kind in steps.WITH_GRAPH else args
    key = (kind, repr(sorted(static.items())), jax.tree.structure(dynamic),
           tuple((x.shape, str(x.dtype)) for x in jax.tree.leaves(dynamic)))
    if key not in self._compiled:
      self._compiled[key] = fn.lower(*args).compile()
      self.hlo.append(self._compiled[key].as_text())
    return self._compiled[key](*dynamic)

  def update_params(self, params, version: int) -> None:
    """New weights (same tree, shapes, dtypes, shardings: no recompilation) labelled `version`."""
    self.params = same_layout(self.params, params)
    self.version = int(version)

  def _decode(self, cache, tok_B, pos_B, gen_B, limit_B, seeds_B, samples_B, live_B, eager, kv_len):
    rows = [self._put(x) for x in (tok_B, pos_B, gen_B, limit_B, seeds_B, samples_B, live_B)]
    rows.append(self._whole(np.asarray(eager)))
    t = time.perf_counter()
    cache, out, logp = self._call("decode", self.graphdef, self.params, cache, *rows, sp=self.sp,
                                  stop_ids=self.stop_ids, steps=self.ec.steps_per_round, kv_len=kv_len)
    host = self._host(out, logp)
    self.device_s += time.perf_counter() - t
    return cache, host


class PagedRunner(Runner):
  """Page pools + compiled prefill/decode."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    cfg, ec = self.cfg, self.ec
    shape = (cfg.num_hidden_layers, ec.pool_pages, ec.page_size, cfg.num_key_value_heads, cfg.head_dim_)
    self.k, self.v = self._zeros(shape, PAGE_AXES, "kv_pool"), self._zeros(shape, PAGE_AXES, "kv_pool")

  def prefill(self, tokens_RxP, lengths_R, table_RxM, seeds_R, row_D, sample_D, copy_src_D, copy_dst_D):
    """(first tokens [D], their log-probs [D]) on this host."""
    rows = [self._put(x) for x in (tokens_RxP, lengths_R, table_RxM, seeds_R)]
    rest = [self._whole(x) for x in (row_D, sample_D, copy_src_D, copy_dst_D)]
    t = time.perf_counter()
    self.k, self.v, first, logp = self._call("prefill_paged", self.graphdef, self.params, self.k, self.v, *rows,
                                             *rest, sp=self.sp)
    host = self._host(first, logp)
    self.device_s += time.perf_counter() - t
    return host

  def decode(self, table_BxM, tok_B, pos_B, gen_B, limit_B, seeds_B, samples_B, live_B, kv_len: int,
             eager: bool = False):
    """(tokens [B, steps], their log-probs [B, steps]) on this host; rows read kv_len slots of their pages."""
    cache = PagedKVCache(self.k, self.v, self._put(table_BxM))
    cache, out = self._decode(cache, tok_B, pos_B, gen_B, limit_B, seeds_B, samples_B, live_B, eager, kv_len)
    self.k, self.v = cache.k, cache.v
    return out

  def warmup(self) -> int:
    """Compile every prefill bucket and every decode KV length once (all writes to scratch); returns programs."""
    from jaxpod.sample.pages import decode_page_buckets
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


class SlotRunner(Runner):
  """Per-layer slot buffers at a bucketed capacity + compiled prefill/insert/resize/decode."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.cache = self._empty(self.ec.kv_buckets()[0])
    self.resizes = 0

  def _empty(self, capacity: int) -> SlotKVCache:
    cfg = self.cfg
    shape = (self.ec.batch_size, cfg.num_key_value_heads, capacity, cfg.head_dim_)
    zeros = [self._zeros(shape, SLOT_AXES, "kv_slots") for _ in range(2 * cfg.num_hidden_layers)]
    return SlotKVCache(tuple(zeros[0::2]), tuple(zeros[1::2]))

  @property
  def capacity(self) -> int:
    return self.cache.capacity

  def resize(self, capacity: int) -> None:
    """Buffers at `capacity` positions (cut or zero-padded; the scheduler keeps live positions below it), one
    bucket at a time (programs for neighbouring buckets only)."""
    caps = self.ec.kv_buckets()
    t = time.perf_counter()
    while capacity != self.capacity:
      i = caps.index(self.capacity)
      step = caps[i + 1] if capacity > self.capacity else caps[i - 1]
      self.cache = jax.block_until_ready(self._call("resize_slots", self.cache, capacity=step))
      self.resizes += 1
    self.device_s += time.perf_counter() - t

  def prefill(self, tokens_RxP, lengths_R, seeds_R, row_D, sample_D):
    """Prefill R prompts: (first tokens [D], their log-probs [D], the prompts' keys/values for `insert`)."""
    rows = [self._put(x) for x in (tokens_RxP, lengths_R, seeds_R)]
    t = time.perf_counter()
    k, v, first, logp = self._call("prefill_slots", self.graphdef, self.params, *rows, self._whole(row_D),
                                   self._whole(sample_D), sp=self.sp)
    host = self._host(first, logp)
    self.device_s += time.perf_counter() - t
    return (*host, (k, v))

  @staticmethod
  def prompt_len(staged) -> int:
    """Positions a prefill output fills (its bucket): the capacity an `insert` of it needs."""
    return staged[0].shape[3]

  def insert(self, staged, row_D, slot_D, count: int) -> None:
    """Slot slot_D[d] gets prompt row row_D[d] of a prefill output, for d < count."""
    if self.prompt_len(staged) > self.capacity:
      raise RuntimeError(f"slot capacity {self.capacity} < prefill length {self.prompt_len(staged)}: resize first")
    t = time.perf_counter()
    self.cache = self._call("insert_slots", self.cache, *staged, self._whole(row_D), self._whole(slot_D),
                            self._whole(np.asarray(count, np.int32)))
    self.device_s += time.perf_counter() - t

  def decode(self, tok_B, pos_B, gen_B, limit_B, seeds_B, samples_B, live_B, eager: bool = False):
    """(tokens [B, steps], their log-probs [B, steps]) on this host; rows read the whole current capacity."""
    self.cache, out = self._decode(self.cache, tok_B, pos_B, gen_B, limit_B, seeds_B, samples_B, live_B, eager,
                                   None)
    return out

  def warmup(self) -> int:
    """Compile every program a run may need: prefill per bucket, insert per (bucket, capacity), decode per
    capacity, resize between neighbouring capacities (all writes land in empty slots); returns how many."""
    ec, r, b = self.ec, self.ec.prefill_rows, self.ec.batch_size
    z = np.zeros((b,), np.int32)
    caps, count = ec.kv_buckets(), len(ec.prefill_buckets())
    staged = {p: self.prefill(np.zeros((r, p), np.int32), np.ones((r,), np.int32), np.zeros((r,), np.uint32), z,
                              z)[2] for p in ec.prefill_buckets()}
    for cap in caps:
      self.resize(cap)
      for bucket in (p for p in ec.prefill_buckets() if p <= cap):
        self.insert(staged[bucket], z, z, 0)
        count += 1  # insert_slots at (bucket, cap)
      self.decode(z, z, z, z, z.astype(np.uint32), z, z.astype(bool))
      count += 1
    count += 2 * (len(caps) - 1)  # resize_slots between neighbours, both ways (compiled by the walk above and back)
    self.resize(caps[0])
    self.resizes = 0
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
