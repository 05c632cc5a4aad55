"""`jaxpod rl`'s summary reads metrics with the trainer's own reader: a torn last line (a run killed mid-write, or a
file read while the trainer appends to it) is skipped, not an error."""
from __future__ import annotations

import json

from jaxpod.rl.summary import by_step, collect, read_metrics


def test_a_torn_last_line_is_skipped_and_a_missing_file_is_no_records(tmp_path):
  train = tmp_path / "train"
  train.mkdir()
  lines = [{"step": 0, "eval/accuracy": 0.25}, {"step": 1, "reward": 0.5}, {"step": 1, "rl/rollout_tokens": 40}]
  (train / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"step": 2, "rew')
  assert read_metrics(str(train)) == lines
  assert by_step(read_metrics(str(train))) == [lines[0], {**lines[1], **lines[2]}]
  assert read_metrics(str(tmp_path / "warmup")) == []  # no warm-up run (model.hf): no records
  out = collect(str(tmp_path))
  assert out["accuracy.start"] == 0.25 and out["reward_curve"] == [[0, 0.5]]
