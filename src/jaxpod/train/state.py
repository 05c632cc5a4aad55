"""`TrainState`: everything a run needs to continue, as one pytree of global arrays.

    params      nnx.State of every nnx.Param (trained)
    buffers     nnx.State of the model's fixed buffers (TRM: H_init, L_init)
    opt_state   optax state of `params`
    ema_params  EMA of `params` (evaluated, checkpointed, exported); None at trainer.ema=0: no copy is
                kept, stored or checkpointed, and `eval_params` is `params` itself
    step        int32 [] optimizer steps taken
    rng         uint32 [2] base key; step k uses fold_in(rng, k), so resuming needs no key history
    carry       the task's state carried across steps (TRM: the ACT carry, as the reference keeps it; LM: ())

The state is built from abstract shapes: `abstract_state` traces init without allocating,
`train_state_shardings` derives a NamedSharding per leaf from the parameters' logical axes (optimizer
and EMA leaves follow the parameter they mirror; the carry splits its batch axis), and
`init_state` runs the jitted init straight into those shardings.
"""
from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from jaxpod.runtime import DEFAULT_RULES, ShardingRules, state_shardings as param_shardings


@flax.struct.dataclass
class TrainState:
  """One pytree for params, buffers, optimizer state, EMA, step, rng and the task's carry."""

  params: Any
  buffers: Any
  opt_state: Any
  ema_params: Any
  step: jax.Array
  rng: jax.Array
  carry: Any

  @property
  def eval_params(self):
    """The parameters evaluated and exported: the EMA when one is kept, else the live ones."""
    return self.params if self.ema_params is None else self.ema_params


def abstract_model(task, seed: int):
  """(graphdef, abstract params, abstract buffers) of the task's model without allocating anything."""
  return task.abstract_model(seed)


def make_init_fn(task, tx: optax.GradientTransformation, seed: int, global_batch: int, ema: bool = True):
  """A function that builds a fresh TrainState (jit it with out_shardings).

  Called with no argument it draws the model from `task.init_model(seed)`; called with
  `(params, buffers)` (e.g. loaded from a HF checkpoint, `Task.initial_params`) it starts from those.
  ema: keep an EMA copy of the params (False at trainer.ema=0: `ema_params` is None)."""
  def init(given=None) -> TrainState:
    params, buffers = task.init_model(seed) if given is None else given
    return TrainState(params=params, buffers=buffers, opt_state=tx.init(params),
                      ema_params=jax.tree.map(jnp.copy, params) if ema else None, step=jnp.zeros([], jnp.int32),
                      rng=jax.random.PRNGKey(seed), carry=task.init_carry(global_batch))
  return init


def abstract_state(init_fn) -> TrainState:
  """ShapeDtypeStructs of the state `init_fn` builds."""
  return jax.eval_shape(init_fn)


def _by_path(tree) -> dict:
  return {tuple(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _match_suffix(path: tuple, shape, known: dict, replicated: NamedSharding) -> NamedSharding:
  """The sharding of the longest known path that ends `path` with the same shape; else replicated."""
  for start in range(len(path)):
    hit = known.get(path[start:])
    if hit is not None and hit[0] == tuple(shape):
      return hit[1]
  return replicated


def batch_sharding(mesh, ndim: int, rules: ShardingRules = DEFAULT_RULES) -> NamedSharding:
  """Leading axis split over the data-parallel mesh axes, the rest whole."""
  return rules.sharding(mesh, ("batch",) + (None,) * (ndim - 1))


def train_state_shardings(abstract: TrainState, mesh, rules: ShardingRules = DEFAULT_RULES) -> TrainState:
  """A TrainState of NamedShardings: params by logical axes, mirrors follow them, carry by batch."""
  replicated = NamedSharding(mesh, PartitionSpec())
  params_sh = param_shardings(abstract.params, mesh, rules)  # one sharding per Variable
  variables = jax.tree.leaves(abstract.params, is_leaf=lambda v: isinstance(v, nnx.Variable))
  sh_leaves = jax.tree.leaves(params_sh)
  known = {}
  for (path, leaf), sharding in zip(jax.tree_util.tree_flatten_with_path(abstract.params)[0], sh_leaves):
    known[tuple(path)] = (tuple(leaf.shape), sharding)
  if len(variables) != len(sh_leaves):
    raise RuntimeError("every parameter must be a single-array nnx.Variable")

  def follow(tree):
    return jax.tree_util.tree_map_with_path(
        lambda path, leaf: _match_suffix(tuple(path), leaf.shape, known, replicated), tree)

  frozen = {}  # buffers that are nnx.Params (frozen weights, e.g. a LoRA base) not mirroring params: own axes
  for path, v in jax.tree_util.tree_flatten_with_path(abstract.buffers, is_leaf=lambda v: isinstance(v, nnx.Param))[0]:
    if isinstance(v, nnx.Param):
      frozen[tuple(path) + tuple(jax.tree_util.tree_flatten_with_path(v)[0][0][0])] = param_shardings(v, mesh, rules)
  buffers = jax.tree_util.tree_map_with_path(
      lambda path, leaf: _match_suffix(tuple(path), leaf.shape, known, frozen.get(tuple(path), replicated)),
      abstract.buffers)
  carry = jax.tree.map(lambda x: batch_sharding(mesh, x.ndim, rules), abstract.carry)
  return TrainState(params=follow(abstract.params), buffers=buffers,
                    opt_state=follow(abstract.opt_state), ema_params=follow(abstract.ema_params),
                    step=replicated, rng=replicated, carry=carry)


def with_shardings(abstract, shardings):
  """ShapeDtypeStructs carrying their target shardings (restore targets, jit out_shardings)."""
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)


def init_state(init_fn, shardings: TrainState, given=None) -> TrainState:
  """Run init under jit directly into the target shardings (no host-side full copy); `given`: starting
  (params, buffers) already placed, or None to draw them."""
  if given is None:
    return jax.jit(init_fn, out_shardings=shardings)()
  return jax.jit(init_fn, out_shardings=shardings)(given)


# ---------------------------------------------------------------------------- checkpoint trees
def _name(key) -> str:
  for attr in ("key", "name", "idx"):
    if hasattr(key, attr):
      return str(getattr(key, attr))
  return str(key)


def to_nested(tree) -> dict:
  """A nested dict of the tree's leaves keyed by path names (what the checkpoint stores)."""
  out: dict = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    node = out
    names = [_name(k) for k in path]
    for n in names[:-1]:
      node = node.setdefault(n, {})
    if names[-1] in node:
      raise ValueError(f"two leaves share the checkpoint path {'/'.join(names)}")
    node[names[-1]] = leaf
  return out


def from_nested(nested: dict, like):
  """Inverse of `to_nested`: the leaves of `nested` back into the structure of `like`."""
  leaves = []
  for path, _ in jax.tree_util.tree_flatten_with_path(like)[0]:
    node = nested
    for k in path:
      node = node[_name(k)]
    leaves.append(node)
  return jax.tree.unflatten(jax.tree.structure(like), leaves)
