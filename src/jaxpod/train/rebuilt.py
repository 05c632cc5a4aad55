"""Buffers a task rebuilds from its starting weights on resume instead of writing them into every checkpoint.

DPO's frozen reference (`task.reference: in_step`) is `TrainState.buffers["ref"]`, a copy of the weights the run
started from, constant for the whole run: written with every checkpoint it was one more copy of the weights in
each (a fifth of the state with AdamW and an EMA). A task lists such buffers in `rebuilt_buffers`; the
checkpoint keeps, instead of them, a digest of each leaf (its sum and sum of squares, float32), and a resume
rebuilds them as a fresh start makes them (`task.initial_params`: the starting checkpoint, e.g. `task.hf` or the
default's warm-up export; else the seeded init) and checks them against the digest: a source that changed
since the run started (another checkpoint at `task.hf`) fails in one line instead of training against another
reference. A checkpoint written before this (it holds the buffers themselves) restores them from itself.
"""
from __future__ import annotations

from typing import Any

import numpy as np

DIGESTS = "rebuilt"  # the checkpoint tree's section holding each rebuilt buffer's digest
RTOL = 1e-4  # sums over the same weights on another mesh differ by the reduction order only


class BufferSourceChanged(ValueError):
  """The buffers rebuilt from the task's source differ from those the run started with."""


class RebuiltBuffers:
  """The checkpoint tree without the task's `rebuilt_buffers`, and the state with them again after a restore."""

  def __init__(self, task, init_fn, mesh, shardings):
    self.task, self.init_fn, self.mesh, self.shardings = task, init_fn, mesh, shardings
    self.keys = tuple(getattr(task, "rebuilt_buffers", ()))
    self._digests: dict[str, Any] = {}  # key -> replicated [leaves, 2] float32 array (what checkpoints store)

  def optional(self) -> tuple[str, ...]:
    """Checkpoint paths a step may lack: the buffers (newer checkpoints) or their digests (older ones)."""
    return tuple(p for k in self.keys for p in (f"buffers/{k}", f"{DIGESTS}/{k}"))

  def target(self, target: dict) -> dict:
    """The restore target (`to_nested` of the abstract state with shardings) with the digests' leaves."""
    if not self.keys:
      return target
    import jax
    from jax.sharding import NamedSharding, PartitionSpec
    replicated = NamedSharding(self.mesh, PartitionSpec())
    count = {k: len(jax.tree.leaves(target["buffers"][k])) for k in self.keys}
    return {**target, DIGESTS: {k: jax.ShapeDtypeStruct((count[k], 2), np.float32, sharding=replicated)
                                for k in self.keys}}

  def complete(self, tree: dict) -> dict:
    """A restored tree with the rebuilt buffers in place (checked against the stored digests), digests left out."""
    if not self.keys:
      return tree
    from jaxpod.train.state import to_nested
    stored = tree.pop(DIGESTS, {})
    missing = [k for k in self.keys if k not in tree.get("buffers", {})]
    if not missing:
      return tree  # written before buffers were rebuilt: they are in the checkpoint
    built = self._build()
    for k in missing:
      if k in stored:
        self._check(k, built[k], stored[k])
      tree.setdefault("buffers", {})[k] = to_nested(built[k])
    return tree

  def remember(self, state) -> None:
    """The digests of the run's buffers (once, after the state is made or restored): what checkpoints keep."""
    self._digests = {k: _digest(state.buffers[k], self.mesh) for k in self.keys}

  def checkpoint_tree(self, state) -> dict:
    """What a checkpoint stores: `to_nested(state)` without the rebuilt buffers, with their digests."""
    from jaxpod.train.state import to_nested
    tree = to_nested(state)
    if self.keys:
      tree["buffers"] = {k: v for k, v in tree["buffers"].items() if k not in self.keys}
      tree[DIGESTS] = dict(self._digests)
    return tree

  def _build(self) -> dict:
    """The buffers as a fresh start makes them: from the task's starting checkpoint, else the seeded init."""
    import jax
    initial = getattr(self.task, "initial_params", None)
    given = initial(self.mesh, self.shardings) if initial is not None else None
    if given is not None:
      buffers = given[1]
    else:
      buffers = jax.jit(lambda: self.init_fn().buffers, out_shardings=self.shardings.buffers)()
    return {k: jax.device_put(buffers[k], self.shardings.buffers[k]) for k in self.keys}

  def _check(self, key: str, built, stored) -> None:
    now, then = _local(_digest(built, self.mesh)), _local(stored)
    if now.shape != then.shape or not np.allclose(now, then, rtol=RTOL, atol=1e-6):
      source = getattr(self.task, "start_url", None) or "the seeded init"
      raise BufferSourceChanged(
          f"the frozen buffers {key!r} rebuilt from {source} differ from those this run started with (a digest "
          "per tensor is checkpointed): the starting weights changed since; give the run the weights it started "
          "from, or start a new run (--trainer.run_name NEW)")


def _local(replicated) -> np.ndarray:
  """A replicated global array's value from this host's first shard (np.asarray refuses one over several hosts)."""
  return np.asarray(replicated.addressable_shards[0].data)


def _digest(tree, mesh):
  """[leaves, 2] float32, replicated: each leaf's sum and sum of squares (every host runs it: a jitted program)."""
  import jax
  import jax.numpy as jnp
  from jax.sharding import NamedSharding, PartitionSpec

  def sums(t):
    leaves = [x.astype(jnp.float32) for x in jax.tree.leaves(t)]
    return jnp.stack([jnp.stack([x.sum(), (x * x).sum()]) for x in leaves])
  return jax.jit(sums, out_shardings=NamedSharding(mesh, PartitionSpec()))(tree)
