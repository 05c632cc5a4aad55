"""`bench rl --against trl` measures TRL's policy as jaxpod measures its own: the same checkpoint, loaded by
transformers through the byte-level tokenizer files, gets the same held-out greedy accuracy; and it says when a
busy machine voids its figures."""
import json
import shutil
from pathlib import Path


def test_hf_greedy_accuracy_of_a_jaxpod_export_equals_jaxpods_own(colocated_run, tmp_path):
  import torch
  from transformers import AutoModelForCausalLM, AutoTokenizer
  from jaxpod.bench.rl.trl_side import held_out_accuracy
  from jaxpod.models.llama.tokenizer import save_byte_tokenizer
  cfg, _, folder = colocated_run
  # the run folder's own summary, not the fixture's: a test that reran the session's run with more steps
  # (test_colocated's rerun) re-exported hf/ and rewrote summary.json together
  summary = json.loads((Path(folder) / "summary.json").read_text())
  policy = shutil.copytree(f"{folder}/hf", tmp_path / "policy")  # the policy whose accuracy.end jaxpod measured
  save_byte_tokenizer(str(policy))
  model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32).eval()
  problems = cfg.problems.eval_set(cfg.trainer.seed)
  got = held_out_accuracy(model, AutoTokenizer.from_pretrained(policy), cfg.problems, problems,
                          cfg.rollout.max_new_tokens)
  # greedy decoding in float32 on two stacks: a near-tie may flip one problem, no more
  assert abs(got - summary["accuracy.end"]) <= 1 / len(problems), (got, summary["accuracy.end"])


def test_the_trl_comparison_is_marked_void_when_a_side_started_on_a_busy_machine(tmp_path, capsys):
  """torch's OpenMP threads stall when other jobs hold the cores, so a side that started under load makes the ratio
  void: the report says NOT QUIET and its JSON `quiet` is false; the same figures on a quiet machine are kept."""
  import os
  from jaxpod.bench.rl.against_trl import QUIET_LOAD, report
  figures = {"seconds_per_step": 2.0, "generate_s": 1.0, "score_s": 0.0, "train_s": 1.0, "tokens_per_s": 10.0,
             "reward_per_s": 1.0, "accuracy_end": 0.5, "accuracy_start": 0.2, "trl_version": "x"}
  busy = QUIET_LOAD * os.cpu_count() + 1
  for load, quiet in ((0.0, True), (busy, False)):
    runs = {"jaxpod": [figures | {"load_start": 0.0}], "trl": [figures | {"load_start": load}]}
    payload = report(runs, steps=4, warmup_steps=0, repeats=1, root=str(tmp_path), json_path=None)
    assert payload["quiet"] is quiet
    assert ("NOT QUIET" in capsys.readouterr().out) is not quiet


def test_the_trl_comparison_alternates_which_side_runs_first_in_each_round():
  """A fair comparison (issue 36): the side that runs second starts at the first one's load, so no side always runs
  second: jaxpod first in even rounds, TRL first in odd ones, each side once per round."""
  from jaxpod.bench.rl.against_trl import side_order
  assert [side_order(r) for r in range(4)] == [("jaxpod", "trl"), ("trl", "jaxpod")] * 2
