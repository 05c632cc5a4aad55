"""Logical axis names -> mesh axes, in one small rules table.

Models annotate parameters and activations with logical names (batch, seq, embed, mlp,
heads, ...) and never with mesh axes. `ShardingRules` maps each logical name to zero, one
or several mesh axes; the translator refuses a spec that would use a mesh axis twice.

Parameters carry their logical axes as NNX variable metadata:
    nnx.Param(init(key, (d, f)), logical_axes=("embed", "mlp"))

A dimension that its mesh axes do not divide (vocab 11 over model=2) cannot be sharded
there. `ShardingRules.indivisible` says what happens: "warn" (default) replicates it and
logs one warning naming the tensor, the dimension and the mesh axes; "error" refuses with
the same message; "replicate" replicates silently. The default is "warn" because
replication never changes results (only memory per device), tiny test models rely on it,
and the warning names the fix; on a pod, where a replicated embedding can be a memory
blow-up, use `rules.replace_policy("error")`.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import jax
from jax.sharding import NamedSharding, PartitionSpec

from jaxpod.runtime.log import get_logger

log = get_logger("sharding")
INDIVISIBLE = ("warn", "error", "replicate")
_warned: set[str] = set()

MeshAxes = str | tuple[str, ...] | None
LogicalAxes = Sequence[str | None]

DEFAULT_RULES: tuple[tuple[str, MeshAxes], ...] = (
    ("batch", ("data", "fsdp")),  # activations: the batch splits over every data-parallel axis
    ("seq", None),
    ("act_embed", None),  # activation hidden dim stays whole
    ("embed", "fsdp"),  # parameter hidden dim: FSDP shards weights along it
    ("mlp", "model"),
    ("heads", "model"),
    ("kv_heads", "model"),
    ("q_heads", "model"),
    ("head_dim", None),
    ("vocab", "model"),
    ("layers", None),
    ("positions", None),
    ("cache_seq", None),
    ("puzzle_ids", None),
)


@dataclasses.dataclass(frozen=True)
class ShardingRules:
  """An ordered table logical name -> mesh axes; unknown names are replicated."""

  rules: tuple[tuple[str, MeshAxes], ...] = DEFAULT_RULES
  indivisible: str = "warn"  # a dimension its mesh axes do not divide: warn (and replicate) | error | replicate

  def __post_init__(self):
    if self.indivisible not in INDIVISIBLE:
      raise ValueError(f"ShardingRules.indivisible={self.indivisible!r}; use one of {INDIVISIBLE}")
    names = [n for n, _ in self.rules]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
      raise ValueError(f"sharding rules name {sorted(dup)} more than once; keep one entry per logical axis")

  def as_dict(self) -> Mapping[str, MeshAxes]:
    return dict(self.rules)

  def replace(self, **overrides: MeshAxes) -> "ShardingRules":
    """A copy with some logical names mapped elsewhere, e.g. `rules.replace(embed=None)`."""
    table = dict(self.rules)
    table.update(overrides)
    return dataclasses.replace(self, rules=tuple(table.items()))

  def replace_policy(self, indivisible: str) -> "ShardingRules":
    """A copy with another policy for indivisible dimensions ("warn", "error", "replicate")."""
    return dataclasses.replace(self, indivisible=indivisible)

  def spec(self, logical: LogicalAxes, mesh=None) -> PartitionSpec:
    """PartitionSpec for a tuple of logical names; mesh axes of size 1 or absent are dropped."""
    table = self.as_dict()
    mesh_axes = dict(mesh.shape) if mesh is not None else None
    used: dict[str, str | None] = {}
    out = []
    for name in logical:
      axes = table.get(name) if name is not None else None
      if axes is None:
        out.append(None)
        continue
      axes = (axes,) if isinstance(axes, str) else tuple(axes)
      if mesh_axes is not None:
        axes = tuple(a for a in axes if mesh_axes.get(a, 1) > 1)
      for a in axes:
        if a in used:
          raise ValueError(
              f"logical spec {tuple(logical)} maps mesh axis {a!r} twice (via {used[a]!r} and {name!r}); "
              f"physical spec so far {tuple(out)}; change the rules so each mesh axis is used once")
        used[a] = name
      out.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    return PartitionSpec(*out)

  def sharding(self, mesh, logical: LogicalAxes) -> NamedSharding:
    """NamedSharding on `mesh` for logical names."""
    return NamedSharding(mesh, self.spec(logical, mesh))

  def fitted_spec(self, logical: LogicalAxes, shape, mesh, name: str = "array") -> PartitionSpec:
    """`spec(logical, mesh)` with indivisible dimensions handled by `self.indivisible` (`name` labels messages)."""
    return _fit(self.spec(logical, mesh), tuple(logical), shape, mesh, self.indivisible, name)


DEFAULT = ShardingRules()
# the engine's weights (`jaxpod.sample.layout`): replicated over the data axes, tensor-parallel over `model`
INFERENCE = DEFAULT.replace(embed=None)


def _is_variable(x) -> bool:
  from flax import nnx
  return isinstance(x, nnx.Variable)


def logical_axes_of(state):
  """Pytree of logical-axis tuples (or None) matching an NNX State's variables."""
  return jax.tree.map(lambda v: v.get_metadata().get("logical_axes"), state, is_leaf=_is_variable)


def state_shardings(state, mesh, rules: ShardingRules = DEFAULT):
  """NamedShardings for every variable of an NNX State (unannotated ones are replicated).

  A dimension whose size the mesh axes do not divide follows `rules.indivisible` (by
  default: replicated, with a warning naming the variable, e.g. vocab 11 over model=2).
  """
  def one(path, v):
    value = v.get_value() if hasattr(v, "get_value") else v.value
    axes = v.get_metadata().get("logical_axes")
    if axes is None:
      return NamedSharding(mesh, PartitionSpec())
    name = jax.tree_util.keystr(path, simple=True, separator=".")
    if len(axes) != len(value.shape):
      raise ValueError(f"{name}: logical_axes {axes} has {len(axes)} names for an array of shape {value.shape}")
    return NamedSharding(mesh, rules.fitted_spec(axes, value.shape, mesh, name))
  return jax.tree_util.tree_map_with_path(one, state, is_leaf=_is_variable)


def _fit(spec: PartitionSpec, logical: tuple, shape, mesh, policy: str, name: str) -> PartitionSpec:
  """Drop the mesh axes of each dimension they do not divide, as `policy` says."""
  parts = []
  logical = logical + (None,) * (len(shape) - len(logical))
  for i, (dim, axes) in enumerate(zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec)))):
    if axes is None:
      parts.append(None)
      continue
    names = (axes,) if isinstance(axes, str) else tuple(axes)
    size = 1
    for a in names:
      size *= mesh.shape[a]
    if dim % size == 0:
      parts.append(axes)
      continue
    msg = (f"{name} {tuple(shape)}: dimension {i} ({logical[i]!r}, size {dim}) is not divisible by mesh axis "
           f"{'*'.join(names)} (size {size})")
    if policy == "error":
      raise ValueError(f"{msg}; pad the dimension to a multiple of {size}, map {logical[i]!r} to another mesh "
                       "axis in the sharding rules, or allow replication (ShardingRules(indivisible='warn'))")
    if policy == "warn" and msg not in _warned:
      _warned.add(msg)
      log.warning("%s: replicated instead (every device holds the whole dimension)", msg)
    parts.append(None)
  return PartitionSpec(*parts)


def constrain(x, logical: LogicalAxes, rules: ShardingRules = DEFAULT, name: str = "activation"):
  """`with_sharding_constraint` by logical names under the current mesh; a no-op without one."""
  mesh = _current_mesh()
  if mesh is None:
    return x
  spec = rules.fitted_spec(logical, x.shape, mesh, name)
  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


def _current_mesh():
  try:
    from jax.sharding import get_abstract_mesh
    am = get_abstract_mesh()
    if am is not None and not am.empty:
      return am
  except ImportError:  # pragma: no cover
    pass
  from jax._src import mesh as mesh_lib
  pm = mesh_lib.thread_resources.env.physical_mesh
  return None if pm.empty else pm
