"""`bench rl --against trl` measures TRL's policy as jaxpod measures its own: the same checkpoint, loaded by
transformers through the byte-level tokenizer files, gets the same held-out greedy accuracy."""
import json
import shutil
from pathlib import Path


def test_hf_greedy_accuracy_of_a_jaxpod_export_equals_jaxpods_own(colocated_run, tmp_path):
  import torch
  from transformers import AutoModelForCausalLM, AutoTokenizer
  from jaxpod.bench.rl_trl import held_out_accuracy
  from jaxpod.models.llama.tokenizer import save_byte_tokenizer
  cfg, _, folder = colocated_run
  # the run folder's own summary, not the fixture's: a test that reran the session's run with more steps
  # (test_colocated's rerun) re-exported hf/ and rewrote summary.json together
  summary = json.loads((Path(folder) / "summary.json").read_text())
  policy = shutil.copytree(f"{folder}/hf", tmp_path / "policy")  # the policy whose accuracy.end jaxpod measured
  save_byte_tokenizer(str(policy))
  model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32).eval()
  problems = cfg.task.eval_set(cfg.trainer.seed)
  got = held_out_accuracy(model, AutoTokenizer.from_pretrained(policy), cfg.task, problems,
                          cfg.rollout.max_new_tokens)
  # greedy decoding in float32 on two stacks: a near-tie may flip one problem, no more
  assert abs(got - summary["accuracy.end"]) <= 1 / len(problems), (got, summary["accuracy.end"])
