"""The device side of the continuous engine for one mesh: `Runner`, what both layouts' runners share
(`slots.SlotRunner`, `paged.PagedRunner`).

A runner owns the KV cache of its layout, puts the scheduler's host arrays on the mesh
(rows split over the data axes), calls its compiled programs (`steps.Program`) and brings the sampled
tokens and log-probs back to this host (global mode with several processes: an all-gather of
the fixed-shape arrays, so every host's scheduler sees the same tokens).

It also holds the weights and their version label, in the inference layout (`layout.py`: replicated
over the data axes, tensor-parallel over `model`): the model it is built with and each version
`update_params` swaps in (same tree, shapes and dtypes, any layout on the mesh's devices) are
resharded there once, so the compiled programs are reused as they are and no decode step
gathers weights.
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

from jaxpod.models.llama import stack
from jaxpod.models.llama.model import Llama
from jaxpod.runtime.sharding import DEFAULT as DEFAULT_RULES
from jaxpod.sample import layout, steps
from jaxpod.sample.config import EngineConfig, SamplingParams


class Runner:
  """Weights, version, and the host <-> mesh plumbing shared by both layouts."""

  def __init__(self, model: Llama, mesh, ec: EngineConfig, sp: SamplingParams, stop_ids: tuple[int, ...],
               global_mode: bool, version: int = 0):
    self.mesh, self.ec, self.sp, self.cfg, self.version = mesh, ec, sp, model.cfg, version
    self.graphdef = stack.engine_graphdef(model)  # a block per layer (models/llama/stack.py says why)
    self.params = self._inference(nnx.state(model))  # once per weight version, never per step
    self.stop_ids, self.global_mode = stop_ids, global_mode
    self._rows = DEFAULT_RULES.spec(("batch",), mesh)[0]
    axes = () if self._rows is None else (self._rows,) if isinstance(self._rows, str) else self._rows
    self.shards = int(np.prod([mesh.shape[a] for a in axes]))  # data shards: rows split in this many blocks
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

  def _call(self, program: steps.Program, *args, **static):
    """Run `program` on the mesh (callers add their wall time, results on the host included, to `device_s`)."""
    fn = steps.compiled(program, self.global_mode, **static)
    with jax.set_mesh(self.mesh):
      return fn(*args) if self.hlo is None else self._aot(fn, program, args, static)

  def _aot(self, fn, program: steps.Program, args, static):
    """Profiling: run an ahead-of-time compiled copy of the program and keep its optimized HLO (`self.hlo`)."""
    dynamic = args[1:] if program.with_graph else args
    key = (program.name, repr(sorted(static.items())), jax.tree.structure(dynamic),
           tuple((x.shape, str(x.dtype)) for x in jax.tree.leaves(dynamic)))
    if key not in self._compiled:
      self._compiled[key] = fn.lower(*args).compile()
      self.hlo.append(self._compiled[key].as_text())
    return self._compiled[key](*dynamic)

  def update_params(self, params, version: int) -> None:
    """New weights (same tree, shapes and dtypes, on the mesh's devices, any layout) labelled `version`: resharded
    into the engine's inference layout here, once per version (the compiled programs are reused as they are)."""
    self.params = same_layout(self.params, layout.place_like(params, self.params, self.cfg.num_hidden_layers))
    self.version = int(version)

  def _inference(self, params):
    """A weight version in the engine's tree (a block per layer) and the inference layout."""
    return layout.to_inference(params, self.mesh, self.cfg.num_hidden_layers)

  def _decode(self, cache, tok_B, pos_B, gen_B, limit_B, seeds_B, samples_B, live_B, eager, kv_len,
              program: steps.Program = steps.DECODE, **static):
    rows = [self._put(x) for x in (tok_B, pos_B, gen_B, limit_B, seeds_B, samples_B, live_B)]
    rows.append(self._whole(np.asarray(eager)))
    t = time.perf_counter()
    cache, out, logp = self._call(program, self.graphdef, self.params, cache, *rows, sp=self.sp,
                                  stop_ids=self.stop_ids, steps=self.ec.steps_per_round, kv_len=kv_len, **static)
    host = self._host(out, logp)
    self.device_s += time.perf_counter() - t
    return cache, host

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
