"""Smoke test of `jaxpod bench sample` at toy size (structure only: tests never assert on time)."""
import json

import pytest

from jaxpod.bench.sample import run


@pytest.mark.slow
def test_bench_sample_smoke(tmp_path):
  out = run(str(tmp_path / "b.json"), hidden_size=64, num_layers=2, vocab_size=300, intermediate_size=128,
            num_heads=4, num_kv_heads=2, batch_size=2, prompt_len=8, max_new_tokens=4, repeats=1, threads=(1,),
            rollout_prompts=6, rollout_min_prompt=2, rollout_max_prompt=20, rollout_n=2, rollout_max_new=12,
            rollout_mean_len=4, rollout_slots=4, rollout_prefill_batch=2, rollout_page_size=4)
  saved = json.loads((tmp_path / "b.json").read_text())
  assert saved["baseline"] == "hf_generate" and set(saved["results"]) == {"continuous", "lockstep", "hf_generate"}
  child = saved["by_threads"]["1 thread"]
  assert child["torch_threads"] == 1 and "intra_op_parallelism_threads=1" in child["xla_flags"]
  for e in ("continuous", "lockstep"):
    assert {"decode_tok_s", "prefill_tok_s", "ttft_s", "roofline"} <= set(out["results"][e])
    assert out["results"][e]["decode_vs_hf"] > 0
    assert child["greedy_tokens_equal_fraction"][e] == 1.0  # same model, same prompts: same greedy tokens
  roll = saved["rollout"]
  assert set(roll["results"]) == {"continuous", "lockstep", "hf_generate"}
  assert all(r["tokens"] > 0 and 1 <= r["len_min"] <= r["len_max"] <= 12 for r in roll["results"].values())
  assert roll["results"]["continuous"]["vs_lockstep"] > 0 and roll["results"]["continuous"]["tokens"] <= 6 * 2 * 12
  assert 0 < roll["kv_memory"]["paged_peak_bytes"] < roll["kv_memory"]["static_bytes"]
  assert (tmp_path / "sample_occupancy.png").read_bytes()[:4] == b"\x89PNG"
