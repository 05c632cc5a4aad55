"""Coordinators: where a trainer registers versions and clients look them up.

One `Coordinator` (version numbering, pruning, pull requests) over three small stores:
- `RayStore`: a Ray named actor (detached, `num_cpus=0`, restarted by Ray if its process
  dies), obtained by `get_or_create_actor`, which is safe when many processes race to create
  it and re-resolves a dead handle. Values may hold Ray object refs (mode "ray").
- `KVStore`: the JAX coordination-service key-value store, through `jaxpod.runtime.kv`, for
  trainer and workers inside one jax.distributed job. JSON values.
- `FileStore`: JSON files under `<folder>/_coord/` through fsspec (listing caches off), for
  checkpoint mode; every write goes to a temporary name first, then is moved into place.

Ordering: every publish gets `seq`, one more than any before on this coordinator, and every
coordinator has an `epoch` (a random id made when its store is first created). Clients
compare `(epoch, seq)`, never the trainer's weight id: see `jaxpod.transfer.api`.
"""
from __future__ import annotations

import json
import random
import time
import uuid
from typing import Any

from jaxpod.runtime import storage
from jaxpod.transfer.config import TransferConfig


# ----------------------------------------------------------------------------- Ray actor

class StoreActor:
  """A dict with atomic counters, run as a Ray actor (methods run one at a time)."""

  def __init__(self):
    self.data: dict[str, Any] = {}

  def setdefault(self, key, value):
    return self.data.setdefault(key, value)

  def incr(self, key):
    self.data[key] = self.data.get(key, 0) + 1
    return self.data[key]

  def put(self, key, value):
    self.data[key] = value

  def get(self, key):
    return self.data.get(key)

  def get_ref(self, pointer):
    """The value named by the value of `pointer` (one round trip for "latest")."""
    key = self.data.get(pointer)
    return None if key is None else self.data.get(key)

  def items(self, prefix):
    return sorted((k, v) for k, v in self.data.items() if k.startswith(prefix))

  def delete(self, key):
    self.data.pop(key, None)


_REMOTE_CLASSES: dict[type, Any] = {}


def get_or_create_actor(cls: type, name: str, namespace: str | None = None, attempts: int = 12,
                        base_delay_s: float = 0.05, max_delay_s: float = 2.0, timeout_s: float = 30.0):
  """Handle to the named detached actor `name`, creating it if absent; safe under a creation race.

  Many processes may call this at once: `get_if_exists` makes all but one attach to the
  winner; a loser that still sees a transient error (the name is registered but the actor
  not yet alive, or a dead actor whose name is being released) retries with capped
  exponential backoff and jitter. The actor asks for no CPU (`num_cpus=0`), so it cannot
  deadlock a full cluster, and `max_restarts=-1` lets Ray restart it if its process dies.
  """
  import ray
  remote_cls = _REMOTE_CLASSES.get(cls)
  if remote_cls is None:
    remote_cls = _REMOTE_CLASSES[cls] = ray.remote(cls)
  last: Exception | None = None
  for attempt in range(attempts):
    try:
      handle = remote_cls.options(name=name, namespace=namespace, get_if_exists=True, lifetime="detached",
                                  num_cpus=0, max_restarts=-1, max_task_retries=3).remote()
      ray.get(handle.__ray_ready__.remote(), timeout=timeout_s)
      return handle
    except Exception as e:  # ValueError (name race), RayActorError (dead), GetTimeoutError
      last = e
      time.sleep(min(max_delay_s, base_delay_s * 2 ** attempt) * (0.5 + random.random()))
  raise RuntimeError(f"could not get or create the Ray actor {name!r} (namespace {namespace!r}) after "
                     f"{attempts} attempts: {last!r}; is ray.init() connected to the cluster?")


class RayStore:
  """Store calls on the named actor, each with a deadline; a dead actor is re-resolved once."""

  def __init__(self, name: str, namespace: str | None, timeout_s: float):
    import ray
    if not ray.is_initialized():
      raise RuntimeError("coordinator='ray' needs a Ray connection: call ray.init(address=...) first")
    self.name, self.namespace, self.timeout_s = name, namespace, timeout_s
    self.actor = get_or_create_actor(StoreActor, name, namespace, timeout_s=timeout_s)

  def _call(self, method: str, *args):
    import ray
    for attempt in range(2):
      try:
        return ray.get(getattr(self.actor, method).remote(*args), timeout=self.timeout_s)
      except ray.exceptions.RayActorError:
        if attempt:
          raise
        self.actor = get_or_create_actor(StoreActor, self.name, self.namespace, timeout_s=self.timeout_s)

  def setdefault(self, key, value): return self._call("setdefault", key, value)
  def incr(self, key): return self._call("incr", key)
  def put(self, key, value): return self._call("put", key, value)
  def get(self, key): return self._call("get", key)
  def get_ref(self, pointer): return self._call("get_ref", pointer)
  def items(self, prefix): return self._call("items", prefix)
  def delete(self, key): return self._call("delete", key)
  def close(self): pass


# ----------------------------------------------------------------------------- JAX kv store

class KVStore:
  """JSON values in the coordination service under `jaxpod_transfer/<name>/`."""

  def __init__(self, name: str, timeout_s: float):
    from jaxpod.runtime import kv
    if not kv.available():
      raise RuntimeError("coordinator='kv' needs a multi-process jax.distributed job: call "
                         "jaxpod.runtime.init() first, or use coordinator='ray' / 'filesystem'")
    self.kv, self.prefix, self.timeout_s = kv, f"jaxpod_transfer/{name}/", timeout_s

  def setdefault(self, key, value):
    try:
      self.kv.set(self.prefix + key, json.dumps(value))
      return value
    except Exception as e:
      if "ALREADY_EXISTS" not in str(e) and "already exists" not in str(e).lower():
        raise
      return json.loads(self.kv.get(self.prefix + key, self.timeout_s))

  def incr(self, key): return self.kv.increment(self.prefix + key)
  def put(self, key, value): self.kv.set(self.prefix + key, json.dumps(value), overwrite=True)

  def get(self, key):
    text = self.kv.try_get(self.prefix + key)
    return None if text is None else json.loads(text)

  def get_ref(self, pointer):
    key = self.get(pointer)
    return None if key is None else self.get(key)

  def items(self, prefix):
    found = self.kv.dir_get(self.prefix + prefix.rstrip("/"))
    return sorted((k[len(self.prefix):], json.loads(v)) for k, v in found)

  def delete(self, key):
    try:
      self.kv.delete(self.prefix + key)
    except Exception:
      pass

  def close(self): pass


# ----------------------------------------------------------------------------- filesystem store

class FileStore:
  """JSON files under `<folder>/_coord/` (fsspec); writes are atomic (`runtime.storage`), reads skip caches."""

  def __init__(self, folder: str):
    import fsspec
    self.fs, root = fsspec.core.url_to_fs(folder)
    self.root = root.rstrip("/") + "/_coord"
    self.fs.makedirs(self.root + "/v", exist_ok=True)
    self.fs.makedirs(self.root + "/pull", exist_ok=True)

  def _path(self, key): return f"{self.root}/{key}.json"

  def put(self, key, value):
    path = self._path(key)
    storage.write_bytes(path if storage.is_local_fs(self.fs) else self.fs.unstrip_protocol(path),
                        json.dumps(value).encode())

  def get(self, key):
    self.fs.invalidate_cache()
    try:
      return json.loads(self.fs.cat_file(self._path(key)))
    except (FileNotFoundError, json.JSONDecodeError):
      return None

  def get_ref(self, pointer):
    key = self.get(pointer)
    return None if key is None else self.get(key)

  def setdefault(self, key, value):
    found = self.get(key)
    if found is None:
      self.put(key, value)
      return value
    return found

  def incr(self, key):  # single writer (the trainer's leader) per folder
    value = (self.get(key) or 0) + 1
    self.put(key, value)
    return value

  def items(self, prefix):
    self.fs.invalidate_cache()
    folder = f"{self.root}/{prefix.rstrip('/')}"
    try:
      names = sorted(self.fs.ls(folder, detail=False))
    except FileNotFoundError:
      return []
    out = []
    for path in names:
      if path.endswith(".json"):
        key = f"{prefix.rstrip('/')}/{path.rsplit('/', 1)[-1][:-5]}"
        value = self.get(key)
        if value is not None:
          out.append((key, value))
    return out

  def delete(self, key):
    try:
      self.fs.rm_file(self._path(key))
    except FileNotFoundError:
      pass

  def close(self): pass


# ----------------------------------------------------------------------------- coordinator

def version_key(seq: int) -> str:
  return f"v/{seq:012d}"


class Coordinator:
  """Version registry and pull-request board over one store."""

  def __init__(self, store, keep_n: int):
    self.store, self.keep_n = store, keep_n

  def epoch(self) -> str:
    """This coordinator's identity; changes only if its store was lost (a new actor, a new job)."""
    return self.store.setdefault("epoch", uuid.uuid4().hex)

  def reserve(self) -> int:
    """The next publication number (strictly larger than every earlier one here)."""
    return int(self.store.incr("seq"))

  def commit(self, seq: int, weight_id: int, epoch: str, meta: Any) -> list[int]:
    """Make version `seq` the newest; returns the seqs dropped beyond keep_n (for the transport)."""
    self.store.put(version_key(seq), {"seq": seq, "weight_id": int(weight_id), "epoch": epoch,
                                      "meta": meta, "time": time.time()})
    self.store.put("latest", version_key(seq))
    return self.prune()

  def prune(self) -> list[int]:
    """Drop version records beyond the newest keep_n."""
    keys = [k for k, _ in self.store.items("v/")]
    dropped = []
    for key in sorted(keys)[:-self.keep_n]:
      self.store.delete(key)
      dropped.append(int(key.split("/")[-1]))
    return dropped

  def latest(self) -> dict | None:
    """The newest committed version record {seq, weight_id, epoch, meta}, or None."""
    return self.store.get_ref("latest")

  def get(self, seq: int) -> dict | None:
    """A version record still kept, or None."""
    return self.store.get(version_key(seq))

  # pull requests (jax_transfer): client asks, trainer's serve loop answers
  def request_pull(self, seq: int, pull_id: int, host: int = 0) -> None:
    self.store.put(f"pull/{pull_id}", {"seq": seq, "host": host, "state": "requested", "time": time.time()})

  def pull_state(self, pull_id: int) -> dict | None:
    return self.store.get(f"pull/{pull_id}")

  def set_pull_state(self, pull_id: int, request: dict, state: str) -> None:
    self.store.put(f"pull/{pull_id}", {**request, "state": state, "time": time.time()})

  def pulls(self) -> list[tuple[int, dict]]:
    return [(int(k.split("/")[-1]), v) for k, v in self.store.items("pull/")]

  def end_pull(self, pull_id: int) -> None:
    self.store.delete(f"pull/{pull_id}")

  def close(self) -> None:
    self.store.close()


def create_coordinator(config: TransferConfig) -> Coordinator:
  """The coordinator named by `config.coordinator`."""
  if config.coordinator == "ray":
    store = RayStore(config.name, config.ray_namespace, config.coordinator_timeout_s)
  elif config.coordinator == "kv":
    store = KVStore(config.name, config.coordinator_timeout_s)
  else:
    store = FileStore(config.folder)
  return Coordinator(store, config.keep_n)
