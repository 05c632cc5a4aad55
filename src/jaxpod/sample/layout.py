"""The inference layout: where the engine keeps its weights, and how a compiled program's collectives are counted.

A trainer shards parameters for training (FSDP: the hidden dimension over `fsdp`); decoding in
that layout makes XLA all-gather every weight onto every device for each call of a decode
round. The engine instead holds its own copy, laid out by `INFERENCE` (the default rules with
`embed` replicated): replicated over the data axes, tensor-parallel over `model` (heads, mlp
width, vocab). `to_inference` moves a weight version there once (a jitted identity with
`out_shardings`: one all-gather per version, none per step); a tree already laid out so is
returned as it is (no copy).

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
from jaxpod.runtime.sharding import INFERENCE, state_shardings


def inference_shardings(params, mesh):
  """NamedShardings of `params` (an NNX State with logical axes) in the inference layout on `mesh`."""
  return state_shardings(params, mesh, INFERENCE)


def to_inference(params, mesh):
  """`params` resharded into the inference layout on `mesh` (no copy where a leaf already is so laid out)."""
  return _move(params, jax.tree.leaves(inference_shardings(params, mesh)))


def place_like(new, old):
  """`new` (another weight version: same tree, shapes and dtypes) laid out as `old`, in one program per layout;
  leaves that differ from `old`'s in tree, shape, dtype or devices are left as they are (the caller's check names
  them)."""
  old_leaves, new_leaves = jax.tree.leaves(old), jax.tree.leaves(new)
  if jax.tree.structure(old) != jax.tree.structure(new) or len(old_leaves) != len(new_leaves):
    return new
  return _move(new, [a.sharding if _movable(b, a) else None for a, b in zip(old_leaves, new_leaves)])


def _movable(b, a) -> bool:
  return (isinstance(b, jax.Array) and tuple(b.shape) == tuple(a.shape) and b.dtype == a.dtype
          and b.sharding.device_set == a.sharding.device_set)


_recent: dict = {}  # (input leaf ids, shardings) -> (weak refs to the inputs, weak refs to their copies)


def _move(tree, want):
  """Leaves of `tree` placed with the shardings `want` (None: left as it is); one cached jit per layout. The same
  arrays moved to the same layout again while the first copy lives (two engines over one weight version: rollout
  and evaluation) share that copy."""
  leaves, treedef = jax.tree.flatten(tree)
  todo = [i for i, (x, s) in enumerate(zip(leaves, want))
          if s is not None and not (isinstance(x, jax.Array) and x.sharding.is_equivalent_to(s, x.ndim))]
  if not todo:
    return tree
  key = (tuple(id(leaves[i]) for i in todo), tuple(want[i] for i in todo))
  ins, outs = _recent.get(key, ((), ()))
  moved = [r() for r in outs]
  if not ins or any(r() is not leaves[i] for r, i in zip(ins, todo)) or any(x is None or x.is_deleted()
                                                                         for x in moved):
    moved = _identity(key[1])(*[leaves[i] for i in todo])
    _recent.clear()  # one entry: the latest version
    _recent[key] = (tuple(weakref.ref(leaves[i]) for i in todo), tuple(weakref.ref(x) for x in moved))
  for i, x in zip(todo, moved):
    leaves[i] = x
  return jax.tree.unflatten(treedef, leaves)


@functools.lru_cache(maxsize=16)
def _identity(shardings: tuple):
  """A jitted identity onto `shardings`: the reshard of one weight version (compiled once per layout)."""
  return jax.jit(lambda *xs: xs, out_shardings=shardings)


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
