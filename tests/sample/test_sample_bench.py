"""Smoke test of `jaxpod bench sample` at toy size (structure only: tests never assert on time)."""
import json

import pytest

from jaxpod.bench.sample.command import run
from jaxpod.bench.common import eigen_dots

ENGINES = {"continuous", "continuous_slots", "continuous_paged", "lockstep", "hf_generate"}


@pytest.mark.slow
def test_bench_sample_smoke(tmp_path):
  # rollout prompts no longer than min_prefill_len and a 16-token KV: one prefill bucket, few KV capacities to compile
  out = run(str(tmp_path / "b.json"), hidden_size=64, num_layers=2, vocab_size=300, intermediate_size=128,
            num_heads=4, num_kv_heads=2, batch_size=2, prompt_len=8, max_new_tokens=4, repeats=1, threads=1,
            min_prefill_len=8, rollout_prompts=6, rollout_min_prompt=2, rollout_max_prompt=8, rollout_n=2,
            rollout_max_new=8, rollout_mean_len=4, rollout_slots=4, rollout_prefill_batch=2, rollout_page_size=4)
  saved = json.loads((tmp_path / "b.json").read_text())
  assert saved["baseline"] == "hf_generate" and set(saved["results"]) == ENGINES
  assert saved["results"]["continuous"]["layout"] == saved["default_layout"] == "slots"
  for e in ENGINES - {"hf_generate"}:
    assert {"decode_tok_s", "prefill_tok_s", "ttft_s", "roofline", "decode_vs_lockstep"} <= set(out["results"][e])
    assert out["results"][e]["decode_vs_hf"] > 0
    if e != "continuous":
      assert saved["greedy_tokens_equal_fraction"][e] == 1.0  # same model, same prompts: same greedy tokens
  roll = saved["rollout"]
  assert set(roll["results"]) == ENGINES
  assert all(r["tokens"] > 0 and 1 <= r["len_min"] <= r["len_max"] <= 8 for r in roll["results"].values())
  for r in roll["results"].values():  # a decode step yields 1 to rollout_slots tokens; each first token is prefill's
    assert -(-(r["tokens"] - 6 * 2) // 4) <= r["decode_steps"] <= r["tokens"] - 6 * 2
    assert r["step_bound"] == pytest.approx(roll["results"]["lockstep"]["decode_steps"] / max(r["decode_steps"], 1))
  slots = roll["results"]["continuous_slots"]
  assert slots["vs_lockstep"] > 0 and slots["tokens"] <= 6 * 2 * 8
  assert slots["prefill_real_per_prompt_token"] == pytest.approx(1 / 2)  # one prefill per group of n=2
  assert roll["results"]["lockstep"]["prefill_real_per_prompt_token"] == 1.0
  assert 0 < roll["kv_memory"]["paged_peak_bytes"] < roll["kv_memory"]["static_bytes"]
  assert set(roll["profile"]["shares"]) == {"attention", "matmuls", "sampling", "other", "host"}
  assert sum(roll["profile"]["shares"].values()) == pytest.approx(1.0)
  assert roll["profile"]["shares"]["matmuls"] > 0 and roll["profile"]["shares"]["attention"] > 0
  assert roll["profile"]["untraced_dots"] == eigen_dots()  # says when its matmul share misses the dots
  assert (tmp_path / "sample_occupancy.png").read_bytes()[:4] == b"\x89PNG"
  fam = saved["families"]  # (a') the default family row set: gemma3_text at the same size
  assert set(fam) == {"llama", "gemma3_text"} and fam["gemma3_text"]["decode_vs_hf"] > 0
  assert fam["gemma3_text"]["greedy_tokens_equal_fraction"] == 1.0
