"""The rollout queue between disaggregated jobs: files under `<run>/queue/` in shared storage (a bucket).

It survives either side's restart because it is nothing but objects in storage, each written whole
(`runtime.storage`: temporary name, then moved into place; a bucket object appears complete):

    queue/rollouts/w<worker>/<seq:08d>.st   a worker's rollout file (safetensors: `to_bytes`, below)
    queue/workers/w<worker>.json            its heartbeat (incarnation, version, counters), every heartbeat_s
    queue/progress.json                     the trainer's record: step, files taken per worker, done

A rollout file holds groups of episodes (a single-turn sample is a one-turn episode): per token
after the prompt, the token, its behaviour log-prob, the weights version that made it (NO_VERSION
for an environment's observation) and whether the policy sampled it (`from_policy`); its metadata
says the file's `format` (FORMAT). The trainer refuses a file of another format (an older worker's
has none) in one line naming the file and the fix, rather than guess what its tokens were.

Exactly-once consumption (invariant 9, "never trains on a rollout twice, across restarts too") lives
in the trainer's checkpoint, not in the queue: `Consumed` is the set of (file, group) the trainer
has taken (trained on, or dropped as too old), saved with every checkpoint as the data state. A
trainer restored from step k takes again exactly the groups it took after step k (they are not in
the restored set, and files are never deleted), and never one it took before. Workers only read
progress.json to bound their backlog (`max_queued_files`); nothing they do changes what the
trainer has consumed.
"""
from __future__ import annotations

import dataclasses
import json
import time
from typing import Sequence

import numpy as np

from jaxpod.policy.rollout.groups import Group
from jaxpod.problems.base import Problem
from jaxpod.runtime import storage

ROLLOUTS, WORKERS, PROGRESS = "rollouts", "workers", "progress.json"
NO_TOKEN = -1  # padding in a rollout file's arrays
FORMAT = 2  # the rollout files' format: 2 added per-token from_policy flags (episodes); 1 had none and no field


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

  def read(self, name: str) -> tuple[list[Group], dict]:
    """Groups and metadata of a rollout file (`from_bytes`: a file of another format is refused, named)."""
    return from_bytes(self.get(name), self._url(ROLLOUTS, name))

  def files(self, worker: int | None = None) -> list[str]:
    """Queue-relative names of the complete rollout files (of one worker, or all), in (worker, seq) order."""
    folders = [f"w{worker}"] if worker is not None else storage.listdir(self._url(ROLLOUTS))
    names = [f"{d}/{n}" for d in folders for n in storage.listdir(self._url(ROLLOUTS, d)) if n.endswith(".st")]
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
    out = {}
    for name in storage.listdir(self._url(WORKERS)):
      if name.endswith(".json"):
        try:
          record = json.loads(storage.read_text(self._url(WORKERS, name)))
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


# ----------------------------------------------------------------------------- rollout files
def to_bytes(groups: Sequence[Group], meta: dict) -> bytes:
  """A rollout file of format FORMAT: safetensors holding padded arrays, the problems and `meta` (worker, file
  number, ...) as JSON metadata; no pickle."""
  from safetensors.numpy import save
  g, n = len(groups), groups[0].n
  width = max(1, max(len(s) for grp in groups for s in grp.sampled))
  plen = max(len(grp.prompt_ids) for grp in groups)
  prompt = np.full((g, plen), NO_TOKEN, np.int32)
  sampled = np.full((g, n, width), NO_TOKEN, np.int32)
  logprobs = np.zeros((g, n, width), np.float32)
  versions = np.full((g, n, width), NO_TOKEN, np.int32)
  from_policy = np.zeros((g, n, width), np.uint8)
  for i, grp in enumerate(groups):
    prompt[i, :len(grp.prompt_ids)] = grp.prompt_ids
    for j in range(n):
      k = len(grp.sampled[j])
      sampled[i, j, :k], logprobs[i, j, :k], versions[i, j, :k] = grp.sampled[j], grp.logprobs[j], grp.versions[j]
      from_policy[i, j, :k] = grp.from_policy[j]
  arrays = {"prompt": prompt, "sampled": sampled, "logprobs": logprobs, "versions": versions,
            "from_policy": from_policy,
            "rewards": np.asarray([grp.rewards for grp in groups], np.float32),
            "correct": np.asarray([grp.correct for grp in groups], np.int32),
            "finished": np.asarray([grp.finished for grp in groups], np.int32)}
  problems = [dataclasses.asdict(grp.problem) for grp in groups]
  return save(arrays, metadata={"format": str(FORMAT), "meta": json.dumps(meta), "problems": json.dumps(problems)})


def _metadata(blob: bytes) -> dict:
  """The `__metadata__` of a safetensors blob (its header: 8-byte little-endian length, then JSON)."""
  size = int.from_bytes(blob[:8], "little")
  return json.loads(blob[8:8 + size]).get("__metadata__", {})


def check_format(meta: dict, name: str) -> None:
  """ValueError (one line naming the file and the fix) unless a rollout file's metadata says format FORMAT."""
  found = meta.get("format")
  if found != str(FORMAT):
    what = "no format field (format 1: no per-token from_policy flags)" if found is None else f"format {found}"
    raise ValueError(f"rollout file {name} has {what}; this jaxpod reads format {FORMAT} only: run the trainer and "
                     "the rollout workers from the same jaxpod, and start a new run (another trainer.runs_dir) "
                     "rather than resume one whose queue an older worker wrote")


def from_bytes(blob: bytes, name: str = "<bytes>") -> tuple[list[Group], dict]:
  """Groups and metadata of a rollout file written by `to_bytes` (`name` for the error on another format)."""
  from safetensors.numpy import load
  meta = _metadata(blob)
  check_format(meta, name)
  arrays = load(blob)
  groups = []
  for i, problem in enumerate(Problem(**p) for p in json.loads(meta["problems"])):
    sampled, logprobs, versions, from_policy = [], [], [], []
    for j in range(arrays["sampled"].shape[1]):
      keep = arrays["sampled"][i, j] != NO_TOKEN
      sampled.append(arrays["sampled"][i, j][keep].tolist())
      logprobs.append(arrays["logprobs"][i, j][keep].tolist())
      versions.append(arrays["versions"][i, j][keep].tolist())
      from_policy.append([bool(x) for x in arrays["from_policy"][i, j][keep]])
    prompt = arrays["prompt"][i]
    groups.append(Group(problem, prompt[prompt != NO_TOKEN].tolist(), sampled, logprobs, versions,
                        [bool(x) for x in arrays["finished"][i]], arrays["rewards"][i].tolist(),
                        [bool(x) for x in arrays["correct"][i]], from_policy))
  return groups, json.loads(meta["meta"])


# ----------------------------------------------------------------------------- what the trainer took
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
