"""The storage layer: URL paths, atomic writes, one-line errors for unusable URLs, shared-storage rule."""
import os
import socket
import subprocess
import sys

import pytest

from jaxpod.runtime import storage


def test_urls_join_and_split_without_pathlib():
  assert storage.join("gs://b/runs", "x", "config.json") == "gs://b/runs/x/config.json"
  assert storage.parent("gs://b/runs/x") == "gs://b/runs" and storage.parent("gs://b") == "gs://b"
  assert storage.name("gs://b/runs/x/") == "x"
  assert storage.absolute("runs") == os.path.abspath("runs") and storage.absolute("gs://b/r") == "gs://b/r"


def test_local_atomic_write_leaves_no_temporary(tmp_path):
  url = str(tmp_path / "a" / "b.json")
  storage.write_text(url, "one")
  storage.write_text(url, "two")
  assert storage.read_text(url) == "two" and os.listdir(tmp_path / "a") == ["b.json"]


def test_bucket_round_trip_listing_append_move(bucket):
  storage.write_text(storage.join(bucket, "r", "a.txt"), "x")
  storage.append_text(storage.join(bucket, "r", "a.txt"), "y")
  assert storage.read_text(storage.join(bucket, "r", "a.txt")) == "xy"
  storage.move(storage.join(bucket, "r"), storage.join(bucket, "moved"))
  assert storage.listdir(bucket) == ["moved"] and storage.listdir(storage.join(bucket, "moved")) == ["a.txt"]


@pytest.mark.parametrize("url,match", [
    ("gs://no-such-bucket-jaxpod/runs", "bucket 'no-such-bucket-jaxpod' does not exist; create it or fix the URL"),
    ("nosuch://b/runs", "Protocol not known"),
    ("s3://b/runs", "no storage backend for 's3://' is installed; install s3fs"),
])
def test_unusable_urls_give_one_line_naming_field_and_fix(gcs, url, match):
  with pytest.raises(storage.StorageError, match=match) as e:
    storage.check_url(url, "trainer.runs_dir")
  assert "trainer.runs_dir" in str(e.value) and "\n" not in str(e.value)


def test_an_unreachable_store_fails_within_the_deadline_naming_the_field():
  """gcsfs retries a dead endpoint for about a minute; the check gives up at its deadline instead."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    closed = s.getsockname()[1]  # nothing listens here once the socket is closed
  code = ("from jaxpod.runtime import storage\n"
          "try:\n  storage.check_url('gs://some-bucket/runs', 'trainer.runs_dir', timeout_s=1)\n"
          "except storage.StorageError as e:\n  print(e)\n")
  env = dict(os.environ, STORAGE_EMULATOR_HOST=f"http://127.0.0.1:{closed}")
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120).stdout
  assert out.startswith("trainer.runs_dir=gs://some-bucket/runs: the store did not answer within 1 s"), out

def test_several_hosts_need_shared_storage(monkeypatch):
  """Invariant 8: a local path (or memory://) is private to each host of a pod unless declared shared."""
  monkeypatch.delenv("JAXPOD_SHARED_LOCAL_DISK", raising=False)
  storage.check_shared("runs", "trainer.runs_dir", 1)
  storage.check_shared("gs://b/runs", "trainer.runs_dir", 4)
  for url in ("runs", "memory://x"):
    with pytest.raises(storage.StorageError, match="has 4 hosts and each has its own disk; use a bucket URL"):
      storage.check_shared(url, "trainer.runs_dir", 4)
  monkeypatch.setenv("JAXPOD_SHARED_LOCAL_DISK", "1")
  storage.check_shared("runs", "trainer.runs_dir", 4)


@pytest.mark.parametrize("args,match", [
    (["--trainer.runs_dir", "gs://no-such-bucket-jaxpod/runs"], "bucket 'no-such-bucket-jaxpod' does not exist"),
    (["--trainer.runs_dir", "runs"], "trainer.runs_dir=runs is a local path, but this job has 2 hosts"),
])
def test_jaxpod_train_refuses_bad_storage_before_jax_starts(gcs, tmp_path, args, match):
  """Invariant 7: one line, exit 2, before any backend (the host count comes from the launch variables)."""
  env = dict(os.environ, JAXPOD_NUM_PROCESSES="2", JAXPOD_PROCESS_ID="0", JAXPOD_COORDINATOR="127.0.0.1:1",
             JAXPOD_DEVICES_PER_HOST="1")
  env.pop("JAXPOD_SHARED_LOCAL_DISK", None)
  p = subprocess.run([sys.executable, "-m", "jaxpod.cli.main", "train", *args], env=env, cwd=tmp_path,
                     capture_output=True, text=True, timeout=120)
  assert p.returncode == 2, p.stderr
  lines = [l for l in p.stderr.splitlines() if l.strip()]
  assert len(lines) == 1 and match in lines[0], p.stderr
