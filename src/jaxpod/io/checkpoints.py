"""Checkpoints on Orbax: async, keep the last N, global resume, never a corrupt or half-written one.

A checkpoint of step k is the folder `<dir>/<k>/` with two items:
    state   the train state as a nested dict of global jax.Arrays (each host writes its own shards)
    data    JSON: every host's data-iterator state, indexed by host (gathered, written by the leader)

Commit protocol. Orbax writes into a temporary folder and renames it when every host is done.
After that the leader writes `jaxpod_manifest.json` (size and CRC32 of every file) into the
step folder. A step counts as committed only with a manifest whose files all match, so a
crash mid-save (no rename, or no manifest yet) and a file damaged later (size or checksum
differs) are both skipped: resume takes the newest step that is good on every host
(invariant 5: hosts agree through `runtime.allgather`, never by each picking its own).
Bad steps newer than the one resumed are moved aside to `<dir>.invalid/` so they are never
listed again and their step numbers can be saved anew.

The checkpoint folder must be storage every host sees (as Orbax requires on multi-host).
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
import zlib
from pathlib import Path
from typing import Any

from jaxpod import runtime
from jaxpod.runtime.log import get_logger

log = get_logger("checkpoints")
MANIFEST = "jaxpod_manifest.json"


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
  """Where and how checkpoints are written."""

  dir: str  # checkpoint folder (shared storage on a real pod)
  keep_last: int = 2  # checkpoints kept on disk
  async_save: bool = True  # write in the background (the host copy is taken before save() returns)
  verify_crc: bool = True  # check every file's CRC32 on resume (else sizes only)

  def __post_init__(self):
    if self.keep_last < 1:
      raise ValueError(f"checkpoints.keep_last={self.keep_last}: keep at least 1")


def _crc(path: Path) -> int:
  crc = 0
  with open(path, "rb") as f:
    while chunk := f.read(1 << 20):
      crc = zlib.crc32(chunk, crc)
  return crc


def _files(step_dir: Path) -> list[Path]:
  return sorted(p for p in step_dir.rglob("*") if p.is_file() and p.name != MANIFEST)


def write_manifest(step_dir: Path) -> None:
  """Record size and CRC32 of every file of a finished step (leader, after Orbax's commit)."""
  entries = {str(p.relative_to(step_dir)): [p.stat().st_size, _crc(p)] for p in _files(step_dir)}
  tmp = step_dir / (MANIFEST + ".tmp")
  tmp.write_text(json.dumps({"files": entries, "time": time.time()}))
  os.replace(tmp, step_dir / MANIFEST)


def verify_step(step_dir: Path, check_crc: bool = True) -> str | None:
  """None if the step folder matches its manifest, else why not."""
  manifest = step_dir / MANIFEST
  if not manifest.is_file():
    return "no manifest (save did not finish)"
  try:
    entries = json.loads(manifest.read_text())["files"]
  except (ValueError, KeyError) as e:
    return f"unreadable manifest ({e})"
  if not entries:
    return "empty manifest"
  for rel, (size, crc) in entries.items():
    p = step_dir / rel
    if not p.is_file():
      return f"missing file {rel}"
    if p.stat().st_size != size:
      return f"{rel}: size {p.stat().st_size} != {size}"
    if check_crc and _crc(p) != crc:
      return f"{rel}: checksum mismatch"
  return None


class Checkpointer:
  """Orbax CheckpointManager with jaxpod's commit protocol and global resume."""

  def __init__(self, cfg: CheckpointConfig):
    import orbax.checkpoint as ocp
    self.cfg = cfg
    self.dir = Path(cfg.dir).absolute()
    self._ocp = ocp
    self._unmanifested: list[int] = []
    self._manager = None

  @property
  def manager(self):
    if self._manager is None:
      ocp = self._ocp
      options = ocp.CheckpointManagerOptions(max_to_keep=self.cfg.keep_last, create=True,
                                             enable_async_checkpointing=self.cfg.async_save)
      self._manager = ocp.CheckpointManager(self.dir, options=options)
    return self._manager

  # ------------------------------------------------------------------ save
  def save(self, step: int, state_tree: Any, data_state: Any) -> None:
    """Save `state_tree` (global arrays) and this host's `data_state` (JSON) at `step`; every host calls."""
    ocp = self._ocp
    data_states = runtime.allgather(data_state, "checkpoints.data_state")
    self._finish_pending()  # the previous save must be committed before the next one starts
    self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state_tree),
                                                    data=ocp.args.JsonSave({"hosts": data_states})))
    self._unmanifested.append(step)
    if not self.cfg.async_save:
      self._finish_pending()

  def _finish_pending(self) -> None:
    """Wait for Orbax to commit the pending saves, then (leader) write their manifests."""
    if not self._unmanifested:
      return
    self.manager.wait_until_finished()
    self._write_manifests()

  def _write_manifests(self) -> None:
    if runtime.is_leader():
      for step in self._unmanifested:
        step_dir = self.dir / str(step)
        if step_dir.is_dir():  # keep_last may already have removed it
          write_manifest(step_dir)
    self._unmanifested = []

  def poll(self) -> None:
    """Commit finished background saves without blocking (call every step; no collective inside)."""
    if self._unmanifested and not self.manager.is_saving_in_progress():
      self._write_manifests()

  def wait(self) -> None:
    """Block until every pending save is committed (manifest written)."""
    self._finish_pending()

  def close(self) -> None:
    self._finish_pending()
    if self._manager is not None:
      self._manager.close()
      self._manager = None

  # ------------------------------------------------------------------ resume
  def _step_dirs(self) -> list[int]:
    if not self.dir.is_dir():
      return []
    return sorted((int(p.name) for p in self.dir.iterdir() if p.is_dir() and p.name.isdigit()), reverse=True)

  def good_steps(self) -> list[int]:
    """Steps whose files match their manifest, newest first (this host's view)."""
    good = []
    for step in self._step_dirs():
      why = verify_step(self.dir / str(step), self.cfg.verify_crc)
      if why is None:
        good.append(step)
      else:
        log.warning("checkpoint step %d is not usable: %s", step, why)
    return good

  def agreed_step(self) -> int | None:
    """Invariant 5: the newest step that is good on every host, or None."""
    views = runtime.allgather(self.good_steps(), "checkpoints.good_steps")
    common = set(views[0]).intersection(*map(set, views[1:]))
    return max(common) if common else None

  def _set_aside_newer(self, step: int | None) -> None:
    """Leader: move steps newer than `step` (all bad) out of the checkpoint folder."""
    if runtime.is_leader():
      for s in self._step_dirs():
        if step is None or s > step:
          dest = Path(str(self.dir) + ".invalid") / f"{s}-{int(time.time())}"
          dest.parent.mkdir(parents=True, exist_ok=True)
          shutil.move(str(self.dir / str(s)), dest)
          log.warning("moved unusable checkpoint step %d to %s", s, dest)
    runtime.barrier("checkpoints.set_aside", timeout_s=120)

  def restore(self, target_tree: Any) -> tuple[int, Any, Any] | None:
    """(step, state tree, this host's data state) from the agreed step, or None to start fresh.

    `target_tree` holds ShapeDtypeStructs with shardings: arrays come back as global jax.Arrays
    placed there (a different mesh than the one saved works).
    """
    step = self.agreed_step()
    self._set_aside_newer(step)
    if step is None:
      return None
    ocp = self._ocp
    restored = self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target_tree),
                                                                  data=ocp.args.JsonRestore()))
    hosts = restored["data"]["hosts"]
    me = runtime.host_info().process_index
    if len(hosts) != runtime.host_info().process_count:
      log.warning("checkpoint %d was written by %d hosts, now %d: data iterators restart", step, len(hosts),
                  runtime.host_info().process_count)
      return step, restored["state"], None
    return step, restored["state"], hosts[me]
