"""Smoke test of the TRM step benchmark (`jaxpod.bench.trm.step.run`): runs, prints, writes JSON."""
from __future__ import annotations

import json

import pytest

from jaxpod.bench.trm import step as trm_step


@pytest.mark.slow
def test_bench_trm_step_smoke(tmp_path, capsys):
  cfg = tmp_path / "trm_micro.yaml"
  cfg.write_text("model:\n  seq_len: 8\n  vocab_size: 5\n  hidden_size: 32\n  num_heads: 2\n  puzzle_emb_ndim: 32\n"
                 "  puzzle_emb_len: 1\n  h_cycles: 2\n  l_cycles: 1\n  l_layers: 1\n  mlp_t: false\n"
                 "  pos_encodings: rope\n  halt_max_steps: 2\n")
  out = tmp_path / "bench.json"
  result = trm_step.run(str(cfg), batch=2, steps=1, json_path=str(out), runs=1, matmul_size=256)
  saved = json.loads(out.read_text())
  assert saved["model_flops_per_step"] == result["model_flops_per_step"] > 0
  assert saved["steps_per_s"] > 0 and 0 < saved["fraction_of_matmul"]
  assert "fraction of matmul" in capsys.readouterr().out


@pytest.mark.slow
def test_bench_trm_step_against_reference(tmp_path, capsys, trm_reference):
  """--reference: both sides run in their own processes on the same config; the ratio is theirs over ours."""
  cfg = tmp_path / "trm_micro.yaml"
  cfg.write_text("model:\n  seq_len: 8\n  vocab_size: 5\n  hidden_size: 32\n  num_heads: 2\n  puzzle_emb_ndim: 32\n"
                 "  puzzle_emb_len: 1\n  h_cycles: 2\n  l_cycles: 1\n  l_layers: 1\n  mlp_t: false\n"
                 "  pos_encodings: rope\n  halt_max_steps: 2\n")
  out = tmp_path / "bench.json"
  result = trm_step.run(str(cfg), batch=2, steps=1, json_path=str(out), runs=2, matmul_size=256,
                        reference=str(trm_reference))
  saved = json.loads(out.read_text())
  ref = saved["reference"]
  assert ref["params"] == saved["params"]  # the same network on both sides
  assert len(ref["step_s_per_run"]) == len(saved["step_s_per_run"]) == 2
  assert saved["jaxpod_over_reference"] == pytest.approx(result["jaxpod_over_reference"])
  assert min(saved["ratio_per_run"]) <= saved["jaxpod_over_reference"] <= max(saved["ratio_per_run"])
  assert "jaxpod / reference" in capsys.readouterr().out


def test_bench_trm_step_rejects_a_folder_without_the_reference(tmp_path):
  with pytest.raises(ValueError, match="models/recursive_reasoning/trm.py"):
    trm_step.run(None, batch=2, steps=1, runs=1, matmul_size=64, reference=str(tmp_path))
