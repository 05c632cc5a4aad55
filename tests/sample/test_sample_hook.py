"""SampleHook during training (2 simulated hosts x 2 devices)."""
import json
from pathlib import Path

import pytest

WORKER = Path(__file__).parent / "workers" / "hook_worker.py"


@pytest.mark.multihost
@pytest.mark.slow
def test_sample_hook_leaves_training_bit_identical(launch_hosts, tmp_path):
  """Invariant 6: the loss sequence with SampleHook every 2 steps equals the one without, bit for bit;
  invariant 4: only the leader writes the samples."""
  r = launch_hosts(WORKER, hosts=2, devices_per_host=2, args=[tmp_path], timeout_s=240)
  assert r.returncode == 0, r.transcript
  for h in range(2):
    losses = dict(l.split(" ", 2)[1:] for l in r.output[h] if l.startswith("LOSSES"))
    assert losses["plain"] == losses["hook"], r.transcript
  rows = [json.loads(l) for l in (tmp_path / "samples.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows] == [2, 2, 4, 4, 6, 6]
  assert rows[-1]["weight_version"] == "step 6"
