"""Smoke test of `jaxpod bench sample` at toy size (structure only: tests never assert on time)."""
import json

import pytest

from jaxpod.bench.sample import run


@pytest.mark.slow
def test_bench_sample_smoke(tmp_path):
  out = run(str(tmp_path / "b.json"), hidden_size=64, num_layers=2, vocab_size=300, intermediate_size=128,
            num_heads=4, num_kv_heads=2, batch_size=2, prompt_len=8, max_new_tokens=4, repeats=1, threads=(1,))
  saved = json.loads((tmp_path / "b.json").read_text())
  assert saved["baseline"] == "hf_generate" and set(saved["results"]) == {"jaxpod", "hf_generate"}
  child = saved["by_threads"]["1 thread"]
  assert child["torch_threads"] == 1 and "intra_op_parallelism_threads=1" in child["xla_flags"]
  assert {"decode_tok_s", "prefill_tok_s", "ttft_s"} <= set(out["results"]["jaxpod"])
  assert out["results"]["jaxpod"]["decode_vs_hf"] > 0
  assert child["greedy_tokens_equal_fraction"] == 1.0  # same model, same prompts: same greedy tokens
