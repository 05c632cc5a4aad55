"""The rollout queue between disaggregated jobs: files under `<run>/queue/` in shared storage (a bucket).

It survives either side's restart because it is nothing but objects in storage, each written whole
(`runtime.storage`: temporary name, then moved into place; a bucket object appears complete):

    queue/rollouts/w<worker>/<seq:08d>.st   a worker's rollout file (safetensors: `rollouts.to_bytes`)
    queue/workers/w<worker>.json            its heartbeat (incarnation, version, counters), every heartbeat_s
    queue/progress.json                     the trainer's record: step, files taken per worker, done

Exactly-once consumption (invariant 9, "never trains on a rollout twice, across restarts too") lives
in the trainer's checkpoint, not in the queue: `Consumed` is the set of (file, group) the trainer
has taken (trained on, or dropped as too old), saved with every checkpoint as the data state. A
trainer restored from step k takes again exactly the groups it took after step k (they are not in
the restored set, and files are never deleted), and never one it took before. Workers only read
progress.json to bound their backlog (`max_queued_files`); nothing they do changes what the
trainer has consumed.
"""
from __future__ import annotations

import json
import time

from jaxpod.runtime import storage

ROLLOUTS, WORKERS, PROGRESS = "rollouts", "workers", "progress.json"


def file_name(worker: int, seq: int) -> str:
  """Queue-relative name of a worker's seq-th file."""
  return f"w{worker}/{seq:08d}.st"


def parse_name(name: str) -> tuple[int, int]:
  """(worker, seq) of a queue-relative file name."""
  w, f = name.split("/")
  return int(w[1:]), int(f.split(".")[0])


class Queue:
  """Storage operations on `<run>/queue` (every call is one or a few object reads/writes)."""

  def __init__(self, run_dir: str):
    self.root = storage.join(run_dir, "queue")

  def _url(self, *parts: str) -> str:
    return storage.join(self.root, *parts)

  # -- rollout files ------------------------------------------------------------------
  def put(self, worker: int, seq: int, blob: bytes) -> str:
    """Write a worker's rollout file (atomically); returns its queue-relative name."""
    name = file_name(worker, seq)
    storage.write_bytes(self._url(ROLLOUTS, name), blob)
    return name

  def get(self, name: str) -> bytes:
    return storage.read_bytes(self._url(ROLLOUTS, name))

  def files(self, worker: int | None = None) -> list[str]:
    """Queue-relative names of the complete rollout files (of one worker, or all), in (worker, seq) order."""
    import fsspec
    base = self._url(ROLLOUTS) if worker is None else self._url(ROLLOUTS, f"w{worker}")
    fs, root = fsspec.core.url_to_fs(base)
    fs.invalidate_cache()
    if not fs.exists(root):
      return []
    found = fs.find(root)
    names = [p[len(root.rstrip("/")) + 1:] for p in found if p.endswith(".st")]
    if worker is not None:
      names = [f"w{worker}/{n}" for n in names]
    return sorted(names, key=parse_name)

  def next_seq(self, worker: int) -> int:
    """One past the newest file this worker has written (a restarted worker continues its numbering)."""
    names = self.files(worker)
    return parse_name(names[-1])[1] + 1 if names else 0

  # -- heartbeats ---------------------------------------------------------------------
  def beat(self, worker: int, record: dict) -> None:
    storage.write_text(self._url(WORKERS, f"w{worker}.json"), json.dumps({**record, "time": time.time()}))

  def heartbeats(self) -> dict[int, dict]:
    """worker -> its latest heartbeat record."""
    import fsspec
    fs, root = fsspec.core.url_to_fs(self._url(WORKERS))
    fs.invalidate_cache()
    if not fs.exists(root):
      return {}
    out = {}
    for path in fs.ls(root, detail=False):
      if path.endswith(".json"):
        try:
          record = json.loads(fs.cat_file(path))
        except (FileNotFoundError, ValueError):
          continue
        out[int(record["worker"])] = record
    return out

  # -- the trainer's progress ---------------------------------------------------------
  def set_progress(self, record: dict) -> None:
    storage.write_text(self._url(PROGRESS), json.dumps({**record, "time": time.time()}))

  def progress(self) -> dict | None:
    url = self._url(PROGRESS)
    try:
      return json.loads(storage.read_text(url)) if storage.exists(url) else None
    except (FileNotFoundError, ValueError):
      return None


class Consumed:
  """The (file, group) pairs the trainer has taken; JSON state for the checkpoint.

  Files whose groups were all taken are kept as per-worker seq ranges (a long run stays small);
  partly taken files list their groups."""

  def __init__(self):
    self.full: dict[int, list[list[int]]] = {}  # worker -> sorted disjoint [lo, hi] ranges of whole files
    self.partial: dict[str, list[int]] = {}  # file -> group indices taken
    self.taken_files: dict[int, int] = {}  # worker -> files with at least one group taken (backlog accounting)

  def is_full(self, name: str) -> bool:
    w, seq = parse_name(name)
    return any(lo <= seq <= hi for lo, hi in self.full.get(w, []))

  def taken(self, name: str) -> set[int]:
    return set(self.partial.get(name, ()))

  def take(self, name: str, groups: list[int], size: int) -> None:
    """Record groups of a file of `size` groups as taken."""
    if not groups:
      return
    w, seq = parse_name(name)
    before = self.taken(name)
    if not before:
      self.taken_files[w] = self.taken_files.get(w, 0) + 1
    got = before | set(groups)
    if len(got) < size:
      self.partial[name] = sorted(got)
      return
    self.partial.pop(name, None)
    ranges = sorted(self.full.get(w, []) + [[seq, seq]])
    merged: list[list[int]] = []
    for lo, hi in ranges:
      if merged and lo <= merged[-1][1] + 1:
        merged[-1][1] = max(merged[-1][1], hi)
      else:
        merged.append([lo, hi])
    self.full[w] = merged

  def state(self) -> dict:
    return {"full": {str(w): r for w, r in self.full.items()}, "partial": self.partial,
            "taken_files": {str(w): n for w, n in self.taken_files.items()}}

  @classmethod
  def from_state(cls, state: dict) -> "Consumed":
    c = cls()
    c.full = {int(w): [list(x) for x in r] for w, r in state.get("full", {}).items()}
    c.partial = {k: list(v) for k, v in state.get("partial", {}).items()}
    c.taken_files = {int(w): int(n) for w, n in state.get("taken_files", {}).items()}
    return c
