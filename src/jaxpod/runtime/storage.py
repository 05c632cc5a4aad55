"""One storage layer: every byte jaxpod writes or reads goes through a URL (fsspec).

    storage.write_text(storage.join(run_url, "config.json"), text)   # atomic: old or new, never a part
    storage.read_text("gs://bucket/runs/x/config.json")
    storage.check_url("gs://bucket/runs", "trainer.runs_dir")         # one line naming URL and fix, early

A URL is `scheme://...` (gs://, s3://, memory://, file://) or a local path. On a pod every
host has its own local disk, so anything another host or a later run must see goes to a
shared URL (a bucket) through here (DESIGN.md invariant 8). Orbax and the compile cache take
the same URLs natively.

Atomic writes: locally a temporary sibling then `os.replace`; on an object store one PUT (an
object appears whole or not at all), so no temporary object is ever left to clean up.
"""
from __future__ import annotations

import os
import posixpath
import threading
import uuid

import fsspec
from fsspec.implementations.local import LocalFileSystem

# Extras that provide a scheme's fsspec backend (the fix named when the import fails).
_BACKENDS = {"gs": "gcsfs (pip install 'jaxpod[gcs]')", "gcs": "gcsfs (pip install 'jaxpod[gcs]')",
             "s3": "s3fs (pip install s3fs)"}


class StorageError(ValueError):
  """A URL that cannot be used: no backend, missing bucket, unreachable store. The message is one line."""


def scheme(url: str) -> str:
  """'gs' for gs://b/x, '' for a local path."""
  head, sep, _ = str(url).partition("://")
  return head if sep else ""


def is_remote(url: str) -> bool:
  """True for anything but a local path (file:// counts as local)."""
  return scheme(url) not in ("", "file", "local")


def absolute(url: str) -> str:
  """Local paths made absolute (hosts may run from different folders); URLs unchanged."""
  url = str(url)
  if scheme(url) in ("file", "local"):
    return url
  return url if is_remote(url) else os.path.abspath(os.path.expanduser(url))


def join(url: str, *parts: str) -> str:
  """URL-aware join: `join('gs://b/runs', 'x', 'config.json')` -> 'gs://b/runs/x/config.json'."""
  url = str(url)
  if not is_remote(url):
    return os.path.join(url, *parts)
  return posixpath.join(url.rstrip("/"), *parts)


def parent(url: str) -> str:
  """The folder holding `url` (a bucket's root is its own parent)."""
  url = str(url).rstrip("/")
  if not is_remote(url):
    return os.path.dirname(absolute(url))
  head, _, path = url.partition("://")
  return f"{head}://{posixpath.dirname(path) or path}"


def name(url: str) -> str:
  """Last component of a URL or path."""
  return posixpath.basename(str(url).rstrip("/"))


def filesystem(url: str):
  """(fsspec filesystem, path within it); a scheme without its backend raises StorageError."""
  try:
    return fsspec.core.url_to_fs(str(url))
  except ImportError:
    fix = _BACKENDS.get(scheme(url), f"the fsspec backend for '{scheme(url)}://'")
    raise StorageError(f"{url}: no storage backend for '{scheme(url)}://' is installed; install {fix}") from None
  except ValueError as e:
    raise StorageError(f"{url}: {e}; use a local path or a URL such as gs://bucket/folder") from None


def is_local_fs(fs) -> bool:
  return isinstance(fs, LocalFileSystem)


def exists(url: str) -> bool:
  """Whether a file or folder exists now (object-store listings are cached per process: bypassed)."""
  fs, path = filesystem(url)
  fs.invalidate_cache(path)
  return fs.exists(path)


def isdir(url: str) -> bool:
  fs, path = filesystem(url)
  fs.invalidate_cache(path)
  return fs.isdir(path)


def listdir(url: str) -> list[str]:
  """Names (not paths) directly under a folder URL; [] if it does not exist."""
  fs, path = filesystem(url)
  try:
    entries = fs.ls(path, detail=False, refresh=True) if not is_local_fs(fs) else fs.ls(path, detail=False)
  except FileNotFoundError:
    return []
  return sorted({posixpath.basename(str(e).rstrip("/")) for e in entries} - {""})


def makedirs(url: str) -> None:
  """Create a folder (a no-op on object stores, where folders are prefixes)."""
  fs, path = filesystem(url)
  if is_local_fs(fs):
    os.makedirs(path, exist_ok=True)


def read_bytes(url: str) -> bytes:
  fs, path = filesystem(url)
  return fs.cat_file(path)


def read_text(url: str) -> str:
  return read_bytes(url).decode("utf-8")


def write_bytes(url: str, data: bytes) -> None:
  """Write atomically: readers see the old content or the new one, never a part."""
  fs, path = filesystem(url)
  if not is_local_fs(fs):
    fs.pipe_file(path, bytes(data))  # one PUT
    return
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
  try:
    with open(tmp, "wb") as f:
      f.write(data)
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def write_text(url: str, text: str) -> None:
  write_bytes(url, text.encode("utf-8"))


def append_text(url: str, text: str) -> None:
  """Append to a text file: in place locally; on object stores (no append) the object is rewritten whole,
  which suits small leader-written logs (samples, summaries), not large streams."""
  fs, path = filesystem(url)
  if is_local_fs(fs):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
      f.write(text)
    return
  old = fs.cat_file(path) if fs.exists(path) else b""
  fs.pipe_file(path, old + text.encode("utf-8"))


def remove(url: str, recursive: bool = False) -> None:
  """Delete a file (or a folder with recursive=True); missing is fine."""
  fs, path = filesystem(url)
  try:
    fs.rm(path, recursive=recursive)
  except FileNotFoundError:
    pass


def move(src: str, dst: str) -> None:
  """Move a file or folder (a rename locally; copy + delete on object stores)."""
  fs, src_path = filesystem(src)
  _, dst_path = filesystem(dst)
  if is_local_fs(fs):
    os.makedirs(os.path.dirname(dst_path) or ".", exist_ok=True)
    os.replace(src_path, dst_path)
  else:
    fs.mv(src_path, dst_path, recursive=True)


def upload(local_dir: str, url: str, sent: dict | None = None) -> None:
  """Copy every file under a local folder to the same relative paths under `url` (each file one PUT).

  With `sent` (a dict the caller keeps between calls), files whose size and mtime are unchanged since
  the last upload are skipped.
  """
  for root, _, files in os.walk(local_dir):
    for f in files:
      path = os.path.join(root, f)
      stat = os.stat(path)
      if sent is not None and sent.get(path) == (stat.st_size, stat.st_mtime_ns):
        continue
      rel = os.path.relpath(path, local_dir)
      with open(path, "rb") as fh:
        write_bytes(join(url, *rel.split(os.sep)), fh.read())
      if sent is not None:
        sent[path] = (stat.st_size, stat.st_mtime_ns)


def _answer_within(fn, timeout_s: float):
  """fn() in a daemon thread; (True, result or exception) if it returned in time, else (False, None).

  Object-store clients retry an unreachable endpoint for minutes (gcsfs: about 66 s); a daemon
  thread lets the caller give up on time and exit without waiting for the retries."""
  box = []

  def call():
    try:
      box.append(fn())
    except Exception as e:  # noqa: BLE001 - handed to the caller
      box.append(e)

  worker = threading.Thread(target=call, daemon=True, name="jaxpod-storage-check")
  worker.start()
  worker.join(timeout_s)
  return (True, box[0]) if box else (False, None)


def check_url(url: str, field: str, timeout_s: float = 20.0) -> None:
  """Fail early, in one line naming `field`, the URL and the fix, if `url` cannot be written.

  Checks that the scheme has a backend and, for buckets, that the bucket exists and answers
  within `timeout_s`. Local folders are created on first write, so only their parent's
  writability is checked.
  """
  if not is_remote(url):
    parent = absolute(url)
    while parent and not os.path.exists(parent):
      parent = os.path.dirname(parent)
    if parent and not os.access(parent, os.W_OK):
      raise StorageError(f"{field}={url}: {parent} is not writable; choose a folder you can write or a bucket URL")
    return
  try:
    fs, path = filesystem(url)
  except StorageError as e:
    raise StorageError(f"{field}: {e}") from None
  bucket = path.split("/", 1)[0]
  if scheme(url) == "memory" or not bucket:
    return
  answered, found = _answer_within(lambda: fs.exists(bucket), timeout_s)
  if not answered:
    raise StorageError(f"{field}={url}: the store did not answer within {timeout_s:g} s; check the network, the "
                       "endpoint (STORAGE_EMULATOR_HOST, proxies) and credentials")
  if isinstance(found, Exception):  # refused credentials, bad endpoint: fsspec backends raise many types
    e = found
    raise StorageError(f"{field}={url}: cannot reach the store ({type(e).__name__}: {str(e).splitlines()[0][:160]}); "
                       "check the network and credentials")
  if not found:
    raise StorageError(f"{field}={url}: bucket '{bucket}' does not exist; create it or fix the URL")


def check_shared(url: str, field: str, num_hosts: int) -> None:
  """Invariant 8: with several hosts, what another host or a later run must see needs shared storage.

  A local path is private to each host of a pod (and `memory://` to each process) unless the user
  declared the local disk shared (`JAXPOD_SHARED_LOCAL_DISK=1`, `jaxpod launch --shared-local-disk true`).
  """
  from jaxpod.runtime.hosts import shared_local_disk
  if num_hosts <= 1 or (is_remote(url) and scheme(url) != "memory"):
    return
  if scheme(url) != "memory" and shared_local_disk():
    return
  what = "process-local memory" if scheme(url) == "memory" else "a local path"
  raise StorageError(f"{field}={url} is {what}, but this job has {num_hosts} hosts and each has its own disk; "
                     "use a bucket URL (gs://bucket/...), or if every host mounts this folder (NFS, gcsfuse) set "
                     "JAXPOD_SHARED_LOCAL_DISK=1 (jaxpod launch --shared-local-disk true)")
