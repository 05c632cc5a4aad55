"""Persistent compile cache: hits across runs, multi-host behaviour, bad folders."""
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from jaxpod.runtime import compile_cache
from tests.conftest import host_lines

WORKER = Path(__file__).parent / "workers" / "cache_worker.py"


def _single(cache: Path) -> tuple[int, int]:
  p = subprocess.run([sys.executable, str(WORKER), str(cache)], capture_output=True, text=True, timeout=120)
  assert p.returncode == 0, p.stderr
  line = [l for l in p.stdout.splitlines() if l.startswith("CACHE")][0]
  hits, misses = map(int, line.split()[1:])
  return hits, misses


def test_second_process_gets_a_cache_hit(tmp_path):
  cache = tmp_path / "cc"
  assert _single(cache)[0] == 0
  assert compile_cache.info(str(cache))["entries"] > 0
  hits, _ = _single(cache)
  assert hits >= 1


@pytest.mark.multihost
def test_with_two_hosts_process_zero_hits_on_rerun(launch_hosts, tmp_path):
  """Only process 0 writes; on a CPU simulation the key includes each process's device
  topology, so only process 0 can hit. On a real pod (shared folder, identical topology
  fingerprints) every host reads process 0's entries."""
  cache = tmp_path / "cc2"
  first = launch_hosts(WORKER, hosts=2, devices_per_host=1, args=[cache])
  assert first.returncode == 0, first.transcript
  again = launch_hosts(WORKER, hosts=2, devices_per_host=1, args=[cache])
  assert again.returncode == 0, again.transcript
  hits0 = int(host_lines(again, 0, "CACHE")[0].split()[0])
  assert hits0 >= 1


def test_unwritable_folder_warns_once_and_continues(tmp_path):
  blocker = tmp_path / "a_file"
  blocker.write_text("x")
  with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    out = compile_cache.setup(compile_cache.CompileCacheConfig(dir=str(blocker / "cache")), None, is_leader=True)
  assert out is None
  assert len(w) == 1 and "not writable" in str(w[0].message) and "runtime.compile_cache.dir" in str(w[0].message)


def test_default_folder_is_a_sibling_of_the_runs_folder(tmp_path, monkeypatch):
  monkeypatch.delenv("JAXPOD_COMPILE_CACHE", raising=False)
  assert compile_cache.default_dir(str(tmp_path / "runs")) == str(tmp_path / "jaxpod_compile_cache")


def test_cache_cli_info_and_clear(tmp_path):
  d = tmp_path / "c"
  (d / "sub").mkdir(parents=True)
  (d / "sub" / "entry").write_bytes(b"x" * 10)
  run = lambda *a: subprocess.run([sys.executable, "-m", "jaxpod.cli.main", "cache", *a, "--dir", str(d)],
                                  capture_output=True, text=True)
  assert "1 files" in run("info").stdout
  assert "removed 1 files" in run("clear").stdout
  assert "0 files" in run("info").stdout
