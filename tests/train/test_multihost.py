"""The trainer on simulated hosts (real processes through jaxpod's launcher)."""
import json
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import host_lines
from tests.train.conftest import tiny_args

WORKER = Path(__file__).parent / "workers" / "train_worker.py"
pytestmark = [pytest.mark.multihost, pytest.mark.slow]


def _losses(run_dir):
  recs = [json.loads(l) for l in Path(run_dir, "metrics.jsonl").read_text().splitlines()]
  return {r["step"]: r["loss"] for r in recs if "loss" in r}


def _summary(result):
  lines = host_lines(result, 0, "SUMMARY")
  assert lines, result.transcript
  return json.loads(lines[0])


def test_one_host_and_two_hosts_give_the_same_losses(launch_hosts, tmp_path, data_dir):
  """Same global batch on 1 host x 1 device and 2 hosts x 2 devices: the same global batches, the same
  losses (within float reduction-order tolerance) and the same eval accuracy."""
  runs = {}
  for hosts, dph in ((1, 1), (2, 2)):
    args = tiny_args(tmp_path, data_dir, steps=4, trainer__run_name=f"h{hosts}")
    r = launch_hosts(WORKER, hosts=hosts, devices_per_host=dph, args=["run", *args])
    assert r.returncode == 0, r.transcript
    runs[hosts] = _summary(r)
  one, two = _losses(runs[1]["run_dir"]), _losses(runs[2]["run_dir"])
  assert sorted(one) == sorted(two) == list(range(1, 5))
  np.testing.assert_allclose([two[s] for s in sorted(two)], [one[s] for s in sorted(one)], rtol=2e-4)
  assert runs[1]["eval"]["count"] == runs[2]["eval"]["count"] == 32
  assert abs(runs[1]["eval"]["accuracy"] - runs[2]["eval"]["accuracy"]) < 1e-3


def test_host_raising_mid_run_stops_every_host_naming_it(launch_hosts, tmp_path, data_dir):
  """Invariant 3: host 1 raises at step 2; host 0 stops with PeerFailed naming host 1 (no hang)."""
  args = tiny_args(tmp_path, data_dir, steps=4, trainer__run_name="raise")
  r = launch_hosts(WORKER, hosts=2, devices_per_host=2, args=["raise:1:2", *args], timeout_s=120)
  assert r.returncode != 0
  failed = host_lines(r, 0, "PEERFAILED")
  assert failed, r.transcript
  info = json.loads(failed[0])
  assert (info["host"], info["type"], info["message"]) == (1, "RuntimeError", "injected failure at step 2")


def test_host_dying_mid_run_is_named_and_a_rerun_resumes(launch_hosts, tmp_path, data_dir):
  """Invariants 3 and 5: host 1 dies without a word at step 5 -> the launch stops naming host 1; the
  rerun resumes every host from the last committed checkpoint (step 4) and finishes."""
  args = tiny_args(tmp_path, data_dir, steps=6, trainer__run_name="dies", trainer__checkpoint_every=2,
                   trainer__async_checkpoints="false")
  r = launch_hosts(WORKER, hosts=2, devices_per_host=2, args=["exit:1:5", *args], grace_s=3, timeout_s=120)
  assert r.returncode != 0 and r.first_failed == 1, r.transcript
  assert "host 1/2 failed first (exit code 7)" in r.transcript
  again = launch_hosts(WORKER, hosts=2, devices_per_host=2, args=["run", *args])
  assert again.returncode == 0, again.transcript
  summary = _summary(again)
  assert summary["resumed"] and summary["start_step"] == 4 and summary["final_step"] == 6
  assert "resumed from checkpoint step 4" in again.host_output(1)
