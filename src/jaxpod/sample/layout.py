"""The inference layout: where the engine keeps its weights, and how a compiled program's collectives are counted.

A trainer shards parameters for training (FSDP: the hidden dimension over `fsdp`); decoding in
that layout makes XLA all-gather every weight onto every device for each call of a decode
round. The engine instead holds its own copy, laid out by `INFERENCE` (the default rules with
`embed` replicated): replicated over the data axes, tensor-parallel over `model` (heads, mlp
width, vocab). `to_inference` moves a weight version there once (a jitted identity with
`out_shardings`: one all-gather per version, none per step); a tree already laid out so is
returned as it is (no copy). The engine keeps a block per layer (`models/llama/stack.py` says why): a model's
stacked block weights [L, ...] are split into per-layer arrays by the same move, leaf by leaf, so a leaf that did
not change between versions (a LoRA run's frozen base) is not moved again while its copy lives.

`collective_bytes(hlo_text, trips)` reads an optimized HLO module (`compiled.as_text()`) and adds
up the result bytes of every collective of a kind, each one counted as often as it runs: once
in the entry computation, `trips` times inside a while loop's body (nested loops multiply),
so an all-gather hoisted out of the decode loop counts once per call of the round.
"""
from __future__ import annotations

import functools
import re
import weakref

import jax
from flax import nnx

from jaxpod.models.llama import stack
from jaxpod.runtime.sharding import INFERENCE, state_shardings


def inference_shardings(params, mesh):
  """NamedShardings of `params` (an NNX State with logical axes) in the inference layout on `mesh`."""
  return state_shardings(params, mesh, INFERENCE)


def engine_tree(params, layers: int):
  """The engine's tree of a weight version: stacked block weights split per layer (abstract: no memory)."""
  return jax.eval_shape(lambda p: stack.unstack_state(p, layers), params)


def to_inference(params, mesh, layers: int):
  """`params` split per layer (`stack.unstack_state`) and resharded into the inference layout on `mesh` (no copy
  where a leaf already is so laid out)."""
  want = inference_shardings(engine_tree(params, layers), mesh)
  return _split_move(params, dict(nnx.to_flat_state(want)), layers)


def place_like(new, old, layers: int):
  """`new` (another weight version of the same model, stacked or per layer) laid out as `old` (the engine's tree);
  leaves that differ from `old`'s in tree, shape, dtype or devices are left as they are (the caller's check names
  them)."""
  if not isinstance(new, nnx.State):
    return new
  target, current = nnx.to_flat_state(engine_tree(new, layers)), dict(nnx.to_flat_state(old))
  if {p for p, _ in target} != set(current):
    return new
  devices = {d for x in jax.tree.leaves(new) if isinstance(x, jax.Array) for d in x.sharding.device_set}
  want = {p: current[p].get_value().sharding if _movable(v, current[p].get_value(), devices) else None
          for p, v in target}
  return _split_move(new, want, layers)


def _movable(b, a, devices) -> bool:
  return tuple(b.shape) == tuple(a.shape) and b.dtype == a.dtype and devices <= set(a.sharding.device_set)


_recent: dict = {}  # (input leaf id, shardings) -> (weak ref to the input, weak refs to its copies)


def _split_move(params, want: dict, layers: int):
  """The engine's tree of `params` with each leaf moved to its sharding in `want` (path -> sharding, None: as it
  is): a stacked leaf split into its layers, a plain one resharded, one cached jit per (leaf shape, layout). The
  same array moved to the same layout again while its copy lives (a frozen base across versions; two engines over
  one weight version: rollout and evaluation) shares that copy."""
  out, live = [], {}
  for path, var in nnx.to_flat_state(params):
    x = var.get_value()
    split = stack.is_stacked_path(path)
    if split:
      names, var = [("layers", i, *path[1:]) for i in range(layers)], stack.without_layers_axis(var)
    else:
      names = [path]
    pieces = _moved(x, tuple(want[n] for n in names), split, live) if isinstance(x, jax.Array) else None
    if pieces is None:
      pieces = [x[i] for i in range(layers)] if split else [x]
    out += [(n, var.replace(p)) for n, p in zip(names, pieces)]
  _recent.clear()  # what this version moved: the next one reuses copies of leaves that did not change
  _recent.update(live)
  return nnx.from_flat_state(out)


def _moved(x: jax.Array, targets: tuple, split: bool, live: dict):
  """x's copies on `targets` (split: one per layer of a stacked leaf), reused while the last move's copy of x lives;
  None when nothing is to be done (no target)."""
  if all(t is None for t in targets):
    return None
  if not split and x.sharding.is_equivalent_to(targets[0], x.ndim):
    return [x]
  key = (id(x), targets)
  ref, outs = _recent.get(key, (None, ()))
  moved = [r() for r in outs]
  if ref is None or ref() is not x or any(y is None or y.is_deleted() for y in moved):
    with jax.set_mesh(targets[0].mesh):  # the caller's context mesh may be another one (a trainer's global mesh)
      moved = list(_mover(x.shape, str(x.dtype), targets, split)(x))
  live[key] = (weakref.ref(x), tuple(weakref.ref(y) for y in moved))
  return moved


@functools.lru_cache(maxsize=64)
def _mover(shape, dtype: str, targets: tuple, split: bool):
  """A jitted split (a stacked leaf: one output per layer) or identity onto `targets` (compiled once per layout)."""
  del dtype
  if not split:
    return jax.jit(lambda x: (x,), out_shardings=targets)
  return jax.jit(lambda x: tuple(x[i] for i in range(shape[0])), out_shardings=targets)


_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4,
                "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16, "f8e4m3fn": 1, "f8e5m2": 1}
_SHAPE = re.compile(r"\b([a-z]+[0-9a-z]*)\[([0-9,]*)\]")
_COMP = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_WHILE_BODY = re.compile(r"\bbody=%?([\w.\-]+)")
_CALLS = re.compile(r"\b(?:calls|to_apply|condition|true_computation|false_computation|branch_computations)="
                    r"\{?%?([\w.\-]+(?:,\s*%?[\w.\-]+)*)\}?")


def _shape_bytes(text: str) -> int:
  total = 0
  for dtype, dims in _SHAPE.findall(text):
    if dtype not in _DTYPE_BYTES:
      continue
    n = 1
    for d in filter(None, dims.split(",")):
      n *= int(d)
    total += n * _DTYPE_BYTES[dtype]
  return total


def collective_bytes(hlo_text: str, trips: int, op: str = "all-gather") -> dict[str, int]:
  """{"once": bytes outside loops, "per_trip": bytes inside loop bodies (one trip), "per_call": once + trips x
  per_trip (nested loops: trips per level)} of the results of every `op` (e.g. all-gather, all-reduce) in a module."""
  comps: dict[str, list[str]] = {}
  entry, name = None, None
  for line in hlo_text.splitlines():
    m = _COMP.match(line)
    if m and not line.startswith(" "):
      name = m.group(1)
      comps[name] = []
      if line.startswith("ENTRY"):
        entry = name
    elif name is not None and line.strip() == "}":
      name = None
    elif name is not None:
      comps[name].append(line)
  if entry is None:
    raise ValueError("collective_bytes: no ENTRY computation in the HLO text; pass compiled.as_text()")
  depth: dict[str, int] = {}  # loop nesting of each computation reachable from the entry

  def visit(comp: str, d: int) -> None:
    if depth.get(comp, -1) >= d:
      return
    depth[comp] = d
    for line in comps.get(comp, ()):
      bodies = set(_WHILE_BODY.findall(line))
      for b in bodies:
        visit(b, d + 1)
      for group in _CALLS.findall(line):
        for callee in re.split(r",\s*%?", group):
          if callee not in bodies:
            visit(callee, d)
  visit(entry, 0)
  pattern = re.compile(rf"=\s*(.*?)\s{re.escape(op)}(?:-start)?\(")
  once = per_trip = per_call = 0
  for comp, d in depth.items():
    for line in comps.get(comp, ()):
      m = pattern.search(line)
      if not m:
        continue
      result = m.group(1)
      if f"{op}-start(" in line:  # async: ((operands), outputs): count the outputs only
        result = result[result.rfind("),") + 2:] if result.startswith("((") else result
      size = _shape_bytes(result)
      per_call += size * trips ** d
      if d == 0:
        once += size
      else:
        per_trip += size
  return {"once": once, "per_trip": per_trip, "per_call": per_call}


def param_bytes(params) -> int:
  """Bytes of every array leaf of a tree (the whole model, not a device's share)."""
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
