"""The trainer on simulated hosts (real processes through jaxpod's launcher), each with its own private
local disk, sharing only a bucket on the test GCS server, as on a pod (invariant 8)."""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from jaxpod.runtime import storage
from tests.conftest import host_lines
from tests.train.conftest import tiny_args

WORKER = Path(__file__).parent / "workers" / "train_worker.py"
pytestmark = [pytest.mark.multihost, pytest.mark.slow]
STEPS = 6


@pytest.fixture(scope="module")
def data_url(gcs):
  """One dataset cache in a bucket for the module: the leader builds it once, every host reads it."""
  return storage.join(gcs.new_bucket("data"), "sudoku")


def _args(runs_url, data_url, **overrides):
  return tiny_args(runs_url, data_url, steps=STEPS, **{"trainer__checkpoint_every": 2, "trainer__run_name": None,
                                                       **overrides})


def _losses(run_dir):
  recs = [json.loads(l) for l in storage.read_text(storage.join(run_dir, "metrics.jsonl")).splitlines()]
  return {r["step"]: r["loss"] for r in recs if "loss" in r}


def _summary(result):
  lines = host_lines(result, 0, "SUMMARY")
  assert lines, result.transcript
  return json.loads(lines[0])


def _local_files(log_dir) -> list[str]:
  """Files the hosts left on their private local disks, caches excepted."""
  roots = Path(log_dir) / "hosts"
  return sorted(str(p.relative_to(roots)) for p in roots.rglob("*")
                if p.is_file() and "/.cache/" not in f"/{p.relative_to(roots)}/")


@pytest.fixture(scope="module")
def uninterrupted(gcs, data_url, tmp_path_factory):
  """One uninterrupted 2 hosts x 2 devices run, its runs bucket and its summary."""
  from tests.conftest import launch_hosts_once
  runs = storage.join(gcs.new_bucket("runs"), "runs")
  log_dir = tmp_path_factory.mktemp("uninterrupted")
  args = _args(runs, data_url, trainer__plot="true", tracker__tensorboard="true")
  r = launch_hosts_once(WORKER, hosts=2, devices_per_host=2, args=["run", *args], log_dir=log_dir)
  assert r.returncode == 0, r.transcript
  return runs, _summary(r), log_dir


def test_two_isolated_hosts_write_everything_to_the_bucket(uninterrupted, data_url):
  """Invariant 8: config, metrics, events, plot, checkpoints and dataset land in the bucket; nothing but
  caches on any host's local disk."""
  runs, summary, log_dir = uninterrupted
  run = summary["run_dir"]
  assert run.startswith("gs://") and storage.parent(run) == runs
  names = storage.listdir(run)
  for expected in ("config.json", "metrics.jsonl", "summary.json", "metrics.png", "tb", "checkpoints"):
    assert expected in names, names
  assert storage.listdir(storage.join(run, "checkpoints"))[-1] == str(STEPS)
  assert storage.listdir(storage.join(run, "tb"))
  assert [d for d in storage.listdir(data_url) if d.startswith("sudoku-2x2-")], "the dataset is in the bucket"
  assert _local_files(log_dir) == [], _local_files(log_dir)


def test_one_host_and_two_hosts_give_the_same_losses(launch_hosts, gcs, data_url, uninterrupted):
  """Same global batch on 1 host x 1 device and 2 hosts x 2 devices: the same global batches, the same
  losses (within float reduction-order tolerance) and the same eval accuracy."""
  runs = storage.join(gcs.new_bucket("runs"), "runs")
  r = launch_hosts(WORKER, hosts=1, devices_per_host=1, args=["run", *_args(runs, data_url)])
  assert r.returncode == 0, r.transcript
  one, two = _summary(r), uninterrupted[1]
  l1, l2 = _losses(one["run_dir"]), _losses(two["run_dir"])
  assert sorted(l1) == sorted(l2) == list(range(1, STEPS + 1))
  np.testing.assert_allclose([l2[s] for s in sorted(l2)], [l1[s] for s in sorted(l1)], rtol=2e-4)
  assert one["eval"]["count"] == two["eval"]["count"] == 32
  assert abs(one["eval"]["accuracy"] - two["eval"]["accuracy"]) < 1e-3


def test_host_raising_mid_run_stops_every_host_naming_it(launch_hosts, bucket, data_url):
  """Invariant 3: host 1 raises at step 2; host 0 stops with PeerFailed naming host 1 (no hang)."""
  args = _args(storage.join(bucket, "runs"), data_url)
  r = launch_hosts(WORKER, hosts=2, devices_per_host=2, args=["raise:1:2", *args], timeout_s=120)
  assert r.returncode != 0
  failed = host_lines(r, 0, "PEERFAILED")
  assert failed, r.transcript
  info = json.loads(failed[0])
  assert (info["host"], info["type"], info["message"]) == (1, "RuntimeError", "injected failure at step 2")


def test_preempted_then_killed_then_plain_rerun_matches_an_uninterrupted_run(launch_hosts, bucket, data_url,
                                                                            uninterrupted, tmp_path):
  """Invariants 3, 5, 8 and preemption, on one run folder with the same command each time:
  1. SIGTERM to host 1 at step 3 -> every host saves the same step (4, the next exchange) and exits 143;
  2. rerun: every host resumes from step 4; host 1 dies without a word at step 5 -> the launch names host 1;
  3. rerun with host 1's local disk wiped (a replaced VM): resumes from step 4 again, hits the compile cache
     in the bucket, and ends with the uninterrupted run's losses and eval, bit for bit."""
  args = _args(storage.join(bucket, "runs"), data_url, trainer__checkpoint_every=0,
               trainer__preemption_check_every=2)
  first = launch_hosts(WORKER, hosts=2, devices_per_host=2, args=["sigterm:1:3", *args], timeout_s=120)
  assert first.returncode == 143, first.transcript
  killed = launch_hosts(WORKER, hosts=2, devices_per_host=2, args=["exit:1:5", *args], grace_s=3, timeout_s=120,
                        log_dir=tmp_path / "killed")
  assert killed.first_failed == 1 and "host 1/2 failed first (exit code 7)" in killed.transcript, killed.transcript
  assert "resumed from checkpoint step 4" in killed.host_output(1)
  shutil.rmtree(tmp_path / "killed" / "hosts" / "host_1")
  again = launch_hosts(WORKER, hosts=2, devices_per_host=2, args=["run", *args], log_dir=tmp_path / "killed")
  assert again.returncode == 0, again.transcript
  summary = _summary(again)
  assert summary["resumed"] and summary["start_step"] == 4 and summary["final_step"] == STEPS
  reference = uninterrupted[1]
  assert _losses(summary["run_dir"]) == _losses(reference["run_dir"])
  assert summary["eval"] == reference["eval"]
  # The compile cache lives beside the runs folder in the bucket (process 0 writes it); every host reports its
  # own hits and misses. On this CPU simulation (jax 0.10.2) only process 0 looks the cache up at all (host 1
  # records neither hits nor misses), so the hit assertion is on the leader.
  assert "jaxpod_compile_cache" in storage.listdir(bucket)
  assert json.loads(host_lines(again, 0, "CACHE")[0])["hits"] > 0
  assert all("compile cache:" in again.host_output(h) for h in (0, 1))
