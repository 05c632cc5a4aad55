"""`jaxpod rl` colocated, in this process: warm-up, GRPO, summary, export, resume (the session's tiny run)."""
import dataclasses
import json

import pytest

from jaxpod.rl.summary import read_metrics


@pytest.mark.slow
def test_summary_has_the_accuracy_before_and_after_rl_and_the_curves(colocated_run):
  cfg, summary, folder = colocated_run
  saved = json.loads(open(f"{folder}/summary.json").read())
  assert saved == json.loads(json.dumps(summary))
  for key in ("accuracy.start", "accuracy.end"):
    assert 0.0 <= saved[key] <= 1.0
  assert saved["accuracy"]["start"] == saved["accuracy.start"]
  assert [v for v, _ in saved["reward_curve"]] == [0, 1, 2]  # the batch of step k was sampled by version k-1
  assert [s for s, _ in saved["accuracy_curve"]] == [0, 3]
  assert saved["tokens_per_s"] > 0 and saved["time_s"]["rollout"] > 0
  assert open(f"{folder}/rl.png", "rb").read(4) == b"\x89PNG"


@pytest.mark.slow
def test_behaviour_logprobs_are_the_trainers_own(colocated_run):
  """Colocated GRPO is on-policy: the engine's recorded log-probs equal the trainer's recomputation (fp32) under
  the same top-k / top-p filtered distribution, so every ratio is 1 and nothing is clipped; a misaligned
  behaviour log-prob, or one recomputed over the unfiltered softmax (issue 25), shows here."""
  _, _, folder = colocated_run
  steps = [r for r in read_metrics(f"{folder}/train") if "logprob_gap" in r]
  assert len(steps) == 3
  for r in steps:
    assert r["logprob_gap"] < 1e-5 and abs(r["ratio"] - 1) < 1e-5 and r["clip_fraction"] == 0, r


@pytest.mark.slow
def test_final_policy_is_a_hf_checkpoint(colocated_run):
  import jax
  from jaxpod.models.llama import hf_io
  from jaxpod.runtime import make_mesh
  cfg, _, folder = colocated_run
  model = hf_io.load(f"{folder}/hf", make_mesh(devices=jax.devices()[:1]))
  assert model.cfg.hidden_size == cfg.model.hidden_size


@pytest.mark.slow
def test_rerun_with_more_steps_continues_the_run(colocated_run):
  """Same command, more steps: the run resumes at its last policy version instead of starting over."""
  from jaxpod.rl.run import run
  cfg, _, folder = colocated_run
  more = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, steps=5))
  summary = run(more)
  assert summary["resumed"] and summary["run_dir"] == folder
  assert [v for v, _ in summary["reward_curve"]] == [0, 1, 2, 3, 4]


def raising_reward(problem, completion, finished):
  """A reward plugin with a bug (named by the test below as "tests.rl.test_colocated:raising_reward")."""
  raise KeyError("no such field")


@pytest.mark.slow
def test_a_raising_reward_plugin_ends_the_run_in_one_line(colocated_run, tmp_path, capsys):
  """Exit 1 and one line naming the plugin and the prompt, no traceback (they were two chained ones)."""
  from jaxpod.cli.main import main
  from tests.rl.clusters import TINY
  code = main(["rl", *TINY, "--warmup.steps", "0", "--trainer.eval_at_start", "false", "--trainer.steps", "1",
               "--trainer.runs_dir", str(tmp_path), "--rewards", "tests.rl.test_colocated:raising_reward"])
  err = capsys.readouterr().err
  assert code == 1, err
  assert "Traceback" not in err, err
  last = err.strip().splitlines()[-1]
  assert last.startswith("jaxpod rl: reward 'tests.rl.test_colocated:raising_reward' raised on prompt '"), err
  assert "KeyError" in last and "no such field" in last, last


def test_train_state_and_engines_that_do_not_fit_the_device_end_in_one_line_naming_the_knob():
  """Invariant 10 / item 6: before the first rollout, the train state plus the rollout and evaluation engines'
  KV caches are checked against device memory; what does not fit is one line naming `rl.rollout`'s knob."""
  import jax
  from flax import nnx

  from jaxpod.models.llama import LlamaConfig, init
  from jaxpod.rl.colocated import check_memory
  from jaxpod.rl.config import RolloutConfig
  from jaxpod.runtime import make_mesh

  cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                    num_key_value_heads=1)
  state = nnx.state(init(cfg), nnx.Param)
  mesh = make_mesh(data=len(jax.devices()), fsdp=1)
  rollout = RolloutConfig(batch_size=256, max_new_tokens=512)
  parts = check_memory(state, mesh, rollout, cfg, available=1 << 34)  # fits: the parts per device come back
  assert set(parts) == {"train_state", "rollout kv_cache", "eval kv_cache"} and parts["rollout kv_cache"] > 0
  with pytest.raises(ValueError, match=r"rl memory check: .* the largest part is rollout kv_cache: lower "
                                       r"rl\.rollout\.batch_size=256 or rl\.rollout\.max_new_tokens=512") as e:
    check_memory(state, mesh, rollout, cfg, available=parts["train_state"] + parts["eval kv_cache"])
  assert "\n" not in str(e.value)
