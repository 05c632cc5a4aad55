"""Smoke test of the TRM step benchmark (`jaxpod.bench.trm_step.run`): runs, prints, writes JSON."""
from __future__ import annotations

import json

import pytest

from jaxpod.bench import trm_step


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
