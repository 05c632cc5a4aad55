"""`jaxpod rl --model.hf` from a Gemma 3 checkpoint (tests/hf_families.py): GRPO steps run colocated, the rollout
engine's log-probs are the trainer's own (on-policy: ratio 1), and the final policy is exported as a checkpoint of
the same family that transformers loads. One family: RL's code is family-agnostic, and Gemma 3 is the one whose
numerics differ most from Llama's (sliding layers, norms around 0, scaled embeddings); Qwen3's are covered by the
sample, causal-LM and HF parity tests (the suite's time budget)."""
import json

import pytest

from tests.rl.clusters import TINY


@pytest.mark.parametrize("family", ["gemma3_text"])
def test_grpo_from_a_family_checkpoint_is_on_policy_and_exports_the_family(hf_family, family, tmp_path):
  import draccus
  import jax
  from jaxpod.models.llama import hf_io
  from jaxpod.rl.config import RLConfig
  from jaxpod.rl.run import run, run_dir
  from jaxpod.rl.summary import read_metrics
  from jaxpod.runtime import make_mesh
  folder, _ = hf_family(family)
  cfg = draccus.parse(RLConfig, args=[*TINY, "--model.hf", folder, "--trainer.steps", "1", "--trainer.eval_every",
                                      "1", "--problems.eval_size", "8", "--trainer.runs_dir", str(tmp_path)])
  summary = run(cfg)
  out = run_dir(cfg)
  steps = [r for r in read_metrics(f"{out}/train") if "logprob_gap" in r]
  assert len(steps) == 1 and summary["reward_curve"]
  for r in steps:  # prompt + answer reach past the sliding window (8): the engine and the trainer agree there too
    assert r["logprob_gap"] < 1e-5 and abs(r["ratio"] - 1) < 1e-5, r
  exported = json.loads(open(f"{out}/hf/config.json").read())
  assert exported["model_type"] == family
  model = hf_io.load(f"{out}/hf", make_mesh(devices=jax.devices()[:1]))
  assert model.cfg.layer_kinds == hf_io.load_config(folder).layer_kinds
  from transformers import AutoModelForCausalLM
  assert AutoModelForCausalLM.from_pretrained(f"{out}/hf").config.model_type == family
