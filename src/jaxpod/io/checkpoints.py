"""Checkpoints on Orbax: async, keep the last N, straight to a URL, global resume, never a half-written one.

A checkpoint of step k is the folder `<dir>/<k>/` (dir: a local path or gs://...) with two items:
    state   the train state as a nested dict of global jax.Arrays (each host writes its own shards)
    data    JSON: every host's data-iterator state, indexed by host (gathered, written by the leader)

Commit protocol: Orbax's own. A save writes into a temporary folder (or, on object stores, is
marked finished by a commit file) once every host is done; `all_steps()` lists finished steps
only, so a crash mid-save is never loaded. The training loop pays nothing beyond Orbax's save:
no re-read of what was written.

Resume (invariant 5): hosts agree on the newest step finished in every host's view, then each
restores it without any collective inside (Orbax's Checkpointer ends a restore with a device
barrier that would hang the others if one host failed). Every host reports success or its error
through `runtime.allgather`; if any host failed (a file truncated or deleted after the commit),
every host falls back together to the previous step, and the leader moves the bad one aside to
`<dir>.invalid/` so its step number can be saved anew. A step whose tree lacks leaves the run needs
(written by another configuration) is not damage: every host raises `CheckpointMismatch` in one line
and nothing is set aside. Leaves the step has beyond the target (an EMA copy written before
`trainer.ema=0` stopped keeping one) are skipped, never read. Leaves under an `optional` path that the step
lacks are left out of what is restored (a frozen DPO reference that newer checkpoints no longer hold).

`verify(URL)` (`jaxpod checkpoint verify`) reads every array of every step to find damage before a
resume needs it, a leaf at a time (a few leaves up to the largest leaf's bytes), so its memory is
bounded by the largest leaf, not the state.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any

from jaxpod import runtime
from jaxpod.runtime import storage
from jaxpod.runtime.log import get_logger

log = get_logger("checkpoints")


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
  """Where and how checkpoints are written."""

  dir: str  # checkpoint folder: a URL every host can write (gs://...) or a local path for one host
  keep_last: int = 2  # checkpoints kept
  async_save: bool = True  # write in the background (the host copy is taken before save() returns)

  def __post_init__(self):
    if self.keep_last < 1:
      raise ValueError(f"checkpoints.keep_last={self.keep_last}: keep at least 1")


def _error_line(e: BaseException) -> str:
  text = str(e).strip().splitlines()
  return f"{type(e).__name__}: {text[0][:300] if text else ''}"


class CheckpointMismatch(ValueError):
  """A checkpoint lacks leaves the run needs: another configuration wrote it (not damage)."""


def _paths(tree) -> dict[str, Any]:
  """'a/b/c' -> leaf of a nested dict tree (what `train.state.to_nested` saves)."""
  import jax
  return {"/".join(str(getattr(k, "key", k)) for k in path): leaf
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _stored_leaves(state_dir) -> dict[str, Any]:
  """Path -> Orbax array metadata (shape, dtype) of every leaf in a step's state item."""
  import orbax.checkpoint as ocp
  return _paths(dict(ocp.PyTreeCheckpointHandler().metadata(state_dir).tree))


def _under(path: str, prefixes: tuple[str, ...]) -> bool:
  return any(path == p or path.startswith(p + "/") for p in prefixes)


def _without(tree: dict, paths: set[str], at: str = "") -> dict:
  """A nested dict without the leaves at `paths` (and without sections left empty)."""
  out = {}
  for k, v in tree.items():
    path = f"{at}{k}"
    if isinstance(v, dict):
      sub = _without(v, paths, path + "/")
      if sub or not v:
        out[k] = sub
    elif path not in paths:
      out[k] = v
  return out


def _restore_items(step_dir: str, target_tree: Any, optional: tuple[str, ...] = ()) -> tuple[Any, Any]:
  """(state, data) of one step folder, read by this host alone (no barrier, no collective); leaves the step
  holds beyond `target_tree` are skipped, leaves it lacks raise CheckpointMismatch (under `optional`: left out)."""
  import orbax.checkpoint as ocp
  from etils import epath
  state_dir = epath.Path(step_dir) / "state"
  stored = _stored_leaves(state_dir)
  absent = sorted(set(_paths(target_tree)) - set(stored))
  per_layer = _per_layer_leaves(absent, stored, _paths(target_tree))
  absent = [p for p in absent if p not in per_layer]
  dropped = {p for p in absent if _under(p, optional)}  # e.g. a rebuilt buffer: the caller makes it anew
  if dropped:
    target_tree = _without(target_tree, dropped)
  missing = sorted(p for p in absent if p not in dropped)
  if missing:
    raise CheckpointMismatch(
        f"checkpoint {step_dir} has no {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''} "
        f"({len(missing)} leaves this run needs): another configuration wrote it (e.g. trainer.ema=0 keeps no "
        "ema_params); resume with that configuration, or start a new run (--trainer.run_name NEW)")
  if per_layer:  # written before the layers were stacked: restore each layer's leaf, then stack them on device
    flat = {k: v for k, v in _paths(target_tree).items() if k not in per_layer}
    flat.update({name: piece for pieces in per_layer.values() for name, piece in pieces})
    target = _nest(flat)
  else:
    target = target_tree
  restore_args = ocp.checkpoint_utils.construct_restore_args(target)
  state = ocp.PyTreeCheckpointHandler().restore(
      state_dir, args=ocp.args.PyTreeRestore(item=target, restore_args=restore_args, partial_restore=True))
  if per_layer:
    got = _paths(state)
    whole = {k: v for k, v in got.items() if k in _paths(target_tree)}
    whole.update({k: _stack([got[name] for name, _ in pieces], _paths(target_tree)[k].sharding)
                  for k, pieces in per_layer.items()})
    state = _nest(whole)
  data = ocp.JsonCheckpointHandler().restore(epath.Path(step_dir) / "data", args=ocp.args.JsonRestore())
  return state, data


def _per_layer_leaves(missing: list[str], stored: dict, wanted: dict) -> dict[str, list]:
  """A checkpoint written before the decoder's layers were stacked holds `.../layers/<i>/<rest>` where the run needs
  one `.../layers/<rest>` [L, ...]: for every missing leaf stored so, (stored name, ShapeDtypeStruct of one layer,
  placed like one slice of the stacked leaf) per layer. Empty unless every layer of a leaf is stored."""
  import jax
  from jax.sharding import NamedSharding, PartitionSpec
  out = {}
  for path in missing:
    parts = path.split("/")
    if "layers" not in parts:
      continue
    k = parts.index("layers")
    leaf = wanted[path]
    names = ["/".join(parts[:k + 1] + [str(i)] + parts[k + 1:]) for i in range(leaf.shape[0])]
    if not all(n in stored and tuple(stored[n].shape) == tuple(leaf.shape[1:]) for n in names):
      continue
    sharding = leaf.sharding
    one = NamedSharding(sharding.mesh, PartitionSpec(*sharding.spec[1:])) if sharding is not None else None
    out[path] = [(n, jax.ShapeDtypeStruct(leaf.shape[1:], leaf.dtype, sharding=one)) for n in names]
  return out


def _stack(layers: list, sharding):
  """One leaf's layers (each placed like a slice of `sharding`) stacked into `sharding`, device by device (this host
  alone: no program spans the hosts, as the rest of a restore)."""
  import jax
  import jax.numpy as jnp
  shards = [{sh.device: sh.data for sh in x.addressable_shards} for x in layers]
  pieces = [jnp.stack([by_device[d] for by_device in shards]) for d in shards[0]]
  return jax.make_array_from_single_device_arrays((len(layers), *layers[0].shape), sharding, pieces)


class Checkpointer:
  """Orbax CheckpointManager with global resume and a joint fall-back from a step that fails to restore."""

  def __init__(self, cfg: CheckpointConfig):
    self.cfg = cfg
    self.dir = storage.absolute(cfg.dir)
    self._manager = None

  @property
  def manager(self):
    if self._manager is None:
      import orbax.checkpoint as ocp
      options = ocp.CheckpointManagerOptions(max_to_keep=self.cfg.keep_last, create=True,
                                             enable_async_checkpointing=self.cfg.async_save,
                                             cleanup_tmp_directories=True)
      self._manager = ocp.CheckpointManager(self.dir, options=options)
    return self._manager

  # ------------------------------------------------------------------ save
  def save(self, step: int, state_tree: Any, data_state: Any) -> None:
    """Save `state_tree` (global arrays) and this host's `data_state` (JSON) at `step`; every host calls."""
    import orbax.checkpoint as ocp
    data_states = runtime.allgather(data_state, "checkpoints.data_state")
    self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state_tree),
                                                    data=ocp.args.JsonSave({"hosts": data_states})), force=True)
    if not self.cfg.async_save:
      self.manager.wait_until_finished()

  def wait(self) -> None:
    """Block until every pending save is committed."""
    if self._manager is not None:
      self._manager.wait_until_finished()

  def close(self) -> None:
    if self._manager is not None:
      self._manager.wait_until_finished()
      self._manager.close()
      self._manager = None

  # ------------------------------------------------------------------ resume
  def steps(self) -> list[int]:
    """Finished steps (Orbax's commit), newest first, as this host sees them."""
    if not storage.exists(self.dir):
      return []
    self.manager.reload()
    return sorted(self.manager.all_steps(), reverse=True)

  def agreed_steps(self) -> list[int]:
    """Invariant 5: steps finished in every host's view, newest first."""
    views = runtime.allgather(self.steps(), "checkpoints.steps")
    return sorted(set(views[0]).intersection(*map(set, views[1:])), reverse=True)

  def _set_aside(self, step: int, why: str) -> None:
    """Leader: move a step that failed to restore out of the folder (never listed again, saved anew)."""
    if runtime.is_leader():
      dest = storage.join(self.dir.rstrip("/") + ".invalid", f"{step}-{int(time.time())}")
      storage.move(storage.join(self.dir, str(step)), dest)
      log.warning("checkpoint step %d is damaged (%s): moved to %s", step, why, dest)
    runtime.barrier("checkpoints.set_aside", timeout_s=600)

  def restore(self, target_tree: Any, optional: tuple[str, ...] = ()) -> tuple[int, Any, Any] | None:
    """(step, state tree, this host's data state) from the newest step every host restores, or None.

    `target_tree` holds ShapeDtypeStructs with shardings: arrays come back as global jax.Arrays
    placed there (a different mesh than the one saved works). Leaves under the `optional` paths ("a/b") that a
    step lacks are absent from its tree.
    """
    for step in self.agreed_steps():
      try:
        state, data, error = *_restore_items(storage.join(self.dir, str(step)), target_tree, optional), None
      except Exception as e:  # a damaged step raises whatever TensorStore or JSON decoding raise
        state, data, error = None, None, _error_line(e)
      errors = runtime.allgather(error, "checkpoints.restore")
      mismatch = next((err for err in errors if err and err.startswith(CheckpointMismatch.__name__)), None)
      if mismatch is not None:  # the same on every host: a configuration change, not damage to set aside
        raise CheckpointMismatch(mismatch.partition(": ")[2])
      failed = {i: err for i, err in enumerate(errors) if err is not None}
      if not failed:
        return step, state, self._host_data(step, data)
      self._set_aside(step, "; ".join(f"host {i}: {err}" for i, err in failed.items()))
      self._manager = None  # its step list is stale
    return None

  def _host_data(self, step: int, data: dict) -> Any:
    hosts = data["hosts"]
    host = runtime.host_info()
    if len(hosts) != host.process_count:
      log.warning("checkpoint %d was written by %d hosts, now %d: data iterators restart", step, len(hosts),
                  host.process_count)
      return None
    return hosts[host.process_index]


def _leaf_groups(leaves: dict[str, Any]) -> list[list[str]]:
  """Leaf paths in groups of at most the largest leaf's bytes (one leaf alone when it is that large)."""
  import numpy as np
  size = {p: int(np.prod(m.shape)) * np.dtype(m.dtype).itemsize for p, m in leaves.items()}
  budget = max(size.values(), default=0)
  groups: list[list[str]] = []
  used = budget + 1
  for p in leaves:
    if used + size[p] > budget:
      groups.append([])
      used = 0
    groups[-1].append(p)
    used += size[p]
  return groups


def _nest(flat: dict[str, Any]) -> dict:
  out: dict = {}
  for path, value in flat.items():
    node = out
    *parents, last = path.split("/")
    for k in parents:
      node = node.setdefault(k, {})
    node[last] = value
  return out


def verify_state(state_dir) -> None:
  """Read every array of one step's state item into host memory, a group of leaves at a time (at most the
  largest leaf's bytes held at once); raises what a damaged array raises."""
  import jax
  import numpy as np
  import orbax.checkpoint as ocp
  leaves = _stored_leaves(state_dir)
  handler = ocp.PyTreeCheckpointHandler()
  for group in _leaf_groups(leaves):
    item = _nest({p: jax.ShapeDtypeStruct(leaves[p].shape, leaves[p].dtype) for p in group})
    args = _nest({p: ocp.RestoreArgs(restore_type=np.ndarray) for p in group})
    handler.restore(state_dir, args=ocp.args.PyTreeRestore(item=item, restore_args=args, partial_restore=True))


def verify(url: str) -> list[tuple[int, str | None]]:
  """Read every array of every finished step under `url` on this host: [(step, None or the error)]."""
  import orbax.checkpoint as ocp
  from etils import epath
  manager = ocp.CheckpointManager(storage.absolute(url), options=ocp.CheckpointManagerOptions(read_only=True))
  out = []
  for step in sorted(manager.all_steps()):
    step_dir = epath.Path(storage.join(storage.absolute(url), str(step)))
    try:
      verify_state(step_dir / "state")  # numpy, leaf by leaf: every byte read, one leaf's worth held
      ocp.JsonCheckpointHandler().restore(step_dir / "data")
      out.append((step, None))
    except Exception as e:
      out.append((step, _error_line(e)))
  manager.close()
  return out
