"""The field report's job as a test: SimPO on 2 hosts x 2 devices (policy FSDP-sharded over all 4), the
SampleHook generating every 2 steps on every host, the leader logging samples; SIGTERM mid-run, rerun.

Invariants: 6 (sampling leaves training bit-identical), 5 (resume is global) and 8 (the hosts share only a
bucket: checkpoint, pair file, data cache and run folder all live in it). One uninterrupted run without
sampling is the reference; the sampled run is preempted at step 3 and rerun with the same command. Its
logged metrics at every step equal the reference's exactly, which holds only if sampling changed nothing
and the resume continued from the same state, data position and rng.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from jaxpod.runtime import storage
from tests.conftest import launch_hosts_once
from tests.tasks.conftest import pref_args

WORKER = Path(__file__).parents[1] / "train" / "workers" / "train_worker.py"
pytestmark = [pytest.mark.multihost, pytest.mark.slow]
STEPS = 6


def _upload(local: str, url: str) -> str:
  src = Path(local)
  for f in ([src] if src.is_file() else sorted(p for p in src.rglob("*") if p.is_file())):
    storage.write_bytes(storage.join(url, f.name) if src.is_dir() else url, f.read_bytes())
  return url


def _records(run_dir) -> dict[int, dict]:
  out: dict[int, dict] = {}
  for line in storage.read_text(storage.join(run_dir, "metrics.jsonl")).splitlines():
    r = json.loads(line)
    out.setdefault(r["step"], {}).update(r)
  return out


@pytest.fixture(scope="module")
def runs(gcs, tiny_ckpt, pair_file, tmp_path_factory):
  """(reference run folder, sampled-and-preempted run folder, the two launch results of the latter)."""
  bucket = gcs.new_bucket("pref")
  ckpt = _upload(tiny_ckpt, storage.join(bucket, "ckpt"))
  pairs = _upload(pair_file, storage.join(bucket, "pairs.jsonl"))
  common = dict(steps=STEPS, task__loss__kind="simpo", mesh__data=1, mesh__fsdp=4, trainer__checkpoint_every=2,
                trainer__preemption_check_every=1)
  logs = tmp_path_factory.mktemp("pref_multihost")
  plain = pref_args(storage.join(bucket, "runs"), ckpt, pairs, trainer__run_name="plain", **common)
  r = launch_hosts_once(WORKER, logs / "plain", args=["run", *plain], timeout_s=400)
  assert r.returncode == 0, r.transcript
  sampled = pref_args(storage.join(bucket, "runs"), ckpt, pairs, trainer__run_name="sampled", task__sample_every=2,
                      task__prompts='["sort:31=", "sort:12="]', **common)
  first = launch_hosts_once(WORKER, logs / "first", args=["sigterm:1:3", *sampled], timeout_s=400)
  second = launch_hosts_once(WORKER, logs / "second", args=["run", *sampled], timeout_s=400)
  return storage.join(bucket, "runs", "plain"), storage.join(bucket, "runs", "sampled"), first, second


def test_sigterm_on_one_host_saves_and_the_rerun_resumes(runs):
  _, sampled, first, second = runs
  assert first.returncode == 143, first.transcript
  assert second.returncode == 0, second.transcript
  summary = json.loads(storage.read_text(storage.join(sampled, "summary.json")))
  assert summary["resumed"] and 3 <= summary["start_step"] < STEPS and summary["final_step"] == STEPS


def test_sampling_and_the_resume_leave_every_logged_metric_bit_identical(runs):
  plain, sampled, _, _ = runs
  a, b = _records(plain), _records(sampled)
  assert sorted(k for k in a if k > 0) == sorted(k for k in b if k > 0) == list(range(1, STEPS + 1))
  for step in range(1, STEPS + 1):
    for name in ("loss", "grad_norm", "rewards/chosen", "rewards/margins", "rewards/accuracies", "logps/rejected"):
      assert a[step][name] == b[step][name], (step, name)
  assert a[STEPS]["eval/loss"] == b[STEPS]["eval/loss"]


def test_every_host_samples_and_the_leader_logs_each_sampling_step_once(runs):
  _, sampled, _, _ = runs
  rows = [json.loads(l) for l in storage.read_text(storage.join(sampled, "samples.jsonl")).splitlines()]
  steps = sorted({r["step"] for r in rows})
  assert steps == [2, 4, 6], steps  # the rerun does not repeat step 2 (before the checkpoint it resumed from)
  assert len(rows) == 2 * len(steps) and all(r["weight_version"] == f"step {r['step']}" for r in rows)
