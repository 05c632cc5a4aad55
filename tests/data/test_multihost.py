"""Loader across real processes: per-host rows assembled into global arrays equal the 1-host batches."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from jaxpod.data.sudoku import SudokuDataConfig, SudokuLoader, build
from tests.conftest import host_lines

WORKER = Path(__file__).parent / "workers" / "loader_worker.py"


@pytest.mark.multihost
@pytest.mark.slow
def test_two_hosts_see_the_one_host_global_batches(launch_hosts, tmp_path):
  """Invariant 1 (same programs, same shapes): every host builds the same global batch from its own rows."""
  path = build(SudokuDataConfig(box="2x2", train=24, test=10, aug=2, seed=0), str(tmp_path / "ds"))
  r = launch_hosts(WORKER, hosts=2, devices_per_host=2, args=[path, 8], timeout_s=150)
  assert r.returncode == 0, r.transcript
  one = SudokuLoader(path, 8, seed=1, shard_index=0, shard_count=1)
  want = [one.train_batch(i)["inputs"].tolist() for i in range(3)]
  for h in range(2):
    assert [json.loads(x) for x in host_lines(r, h, "BATCH")] == want
    assert json.loads(host_lines(r, h, "STATE")[0]) == {"next_index": 3}
    assert json.loads(host_lines(r, h, "EVAL")[0]) == [8, 2]
  assert np.asarray(want).shape == (3, 8, 16)
