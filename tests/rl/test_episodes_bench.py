"""Smoke test of `jaxpod bench rl --episodes` at toy size (structure only: tests never assert on time)."""
import json

import pytest

# the synthetic example cut to 2 turns (<= 20 + 16 + 16 tokens of context): fewer engine programs to compile, still a
# re-prefilled turn
TOY = ("--grpo.num_prompts_per_step", "2", "--grpo.sample_prompts_per_step", "2", "--grpo.num_generations", "2",
       "--grpo.filter_groups", "false", "--problems.max_turns", "2", "--rollout.max_prompt_len", "64",
       "--rollout.max_new_tokens", "16", "--rollout.batch_size", "4",
       "--rollout.eval_slots", "4", "--rollout.groups_per_file", "2", "--problems.eval_size", "4", "--eval.k", "0")


@pytest.mark.slow
def test_bench_rl_episodes_times_kept_and_whole_rl_steps_on_the_same_episodes(tmp_path):
  from jaxpod.bench.rl.episodes import run
  from jaxpod.bench.rl.step import save_policy
  from jaxpod.policy.spec import PolicyModelConfig
  small = PolicyModelConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, max_position_embeddings=256)
  policy = save_policy(small.llama(), str(tmp_path))  # a random policy instead of a warm-up (not what is measured)
  out = run(str(tmp_path / "b.json"), steps=3, repeats=1, examples=("synthetic",), shapes=TOY, policy=policy)
  saved = json.loads((tmp_path / "b.json").read_text())
  assert saved["benchmark"] == "rl-episodes" and set(saved["results"]) == {"synthetic:kept", "synthetic:whole"}
  kept, whole = out["results"]["synthetic:kept"], out["results"]["synthetic:whole"]
  for r in (kept, whole):
    assert r["step_s"] > 0 and r["rollout_s"] > 0 and r["prefill_per_episode"] > 0
  assert kept["distinct_per_episode"] == whole["distinct_per_episode"]  # the same episodes in both arms
  assert saved["checks"]["synthetic"]["same_episodes"] is True
  assert kept["prefill_per_episode"] < whole["prefill_per_episode"]  # whole re-prefills each later turn's context
