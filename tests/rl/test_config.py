"""`jaxpod rl` refuses a bad config in one line, before JAX starts or anything compiles (invariant 7)."""
import subprocess
import sys

import pytest

from jaxpod.cli.main import main


@pytest.mark.parametrize("argv, message", [
    (["--rewards", "no_such_reward"], "rl.rewards: 'no_such_reward' is not a registered reward (boxed, exact_match, format, gsm8k)"),
    (["--rewards", "no_such_module:fn"], "rl.rewards: cannot import 'no_such_module:fn'"),
    (["--grpo.num_generations", "1"], "rl.grpo.num_generations=1: GRPO needs n >= 2 samples per prompt"),
    (["--problems.length", "20"], "rl.problems prompts reach 27 tokens (e.g."),
    (["--rollout.max_new_tokens", "3"], "rl.problems turns need 7 tokens with EOS (e.g. on "),
    (["--topology", "sideways"], "rl.topology='sideways'; use one of ('colocated', 'disaggregated')"),
    (["--role", "trainer"], "rl.role='trainer' needs --topology disaggregated"),
    (["--model.hf", "/no/such/checkpoint"], "model.hf=/no/such/checkpoint: no config.json there"),
    (["--rollout.top_p", "1.5"], "rl.rollout.top_p=1.5 must be in (0, 1]"),
    (["--rollout.top_k", "-3"], "rl.rollout.top_k=-3 must be >= 0"),
    (["--rollout.slots", "64"], "--rollout.slots was renamed: use --rollout.batch_size"),
    (["--rollout.n", "4"], "rl.rollout.n=4: RL samples grpo.num_generations completions per prompt"),
    (["--warmup.batch_size", "96", "--grpo.num_prompts_per_step", "16", "--runtime.devices_per_host", "3"],
     "rl.grpo.num_prompts_per_step=16: 16 prompts x 8 samples = 128 rows per step do not split over 1 host(s) in "
     "whole groups and the data-parallel size 3"),
    (["--warmup.batch_size", "100", "--runtime.devices_per_host", "8"], "rl.warmup.batch_size=100 does not split"),
    (["--rollout.batch_size", "100", "--runtime.devices_per_host", "8"], "rl.rollout.batch_size=100 (decode slots)"),
    (["--topology", "disaggregated", "--grpo.max_policy_lag", "0"],
     "rl.transfer.background=true publishes version k while step k+1 trains"),  # the background upload needs lag
])
def test_bad_config_is_one_line_before_jax(argv, message, capsys, tmp_path):
  code = main(["rl", "--trainer.runs_dir", str(tmp_path / "runs"), *argv])
  err = capsys.readouterr().err.strip()
  assert code == 2, err
  assert message in err and len(err.splitlines()) == 1, err


def test_bad_configs_fail_before_any_jax_backend_starts(tmp_path):
  """In a fresh process: three bad configs fail and no JAX backend (device, compiler) was ever started."""
  code = f"""
import sys
from jaxpod.cli.main import main
codes = [main(["rl", "--trainer.runs_dir", {str(tmp_path)!r}, *a]) for a in
         (["--rewards", "nope"], ["--grpo.num_generations", "1"], ["--problems.length", "20"])]
from jax._src import xla_bridge
print("RESULT", codes, bool(xla_bridge._backends))
"""
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert "RESULT [2, 2, 2] False" in out.stdout, out.stdout + out.stderr


def test_help_lists_every_section(capsys):
  assert main(["rl", "--help"]) == 0
  out = capsys.readouterr().out
  for section in ("--grpo.num_generations", "--rollout.update", "--model.hf", "--topology", "--warmup.steps"):
    assert section in out


def test_another_task_type_keeps_the_default_sections_but_not_its_task_fields():
  """`--problems.type addition` on the embedded sort default: the addition task with its own defaults, the rest kept."""
  from jaxpod.cli.rl import load_config
  from jaxpod.problems.generated import AdditionProblems
  default, addition = load_config([]), load_config(["--problems.type", "addition", "--problems.digits", "2"])
  assert isinstance(addition.problems, AdditionProblems) and addition.problems.digits == 2
  assert addition.grpo == default.grpo and addition.warmup == default.warmup and addition.rollout == default.rollout


def test_a_renamed_key_in_a_config_file_names_its_new_name(tmp_path, capsys):
  path = tmp_path / "rl.yaml"
  path.write_text("rollout:\n  slots: 64\n")
  assert main(["rl", "--config_path", str(path)]) == 2
  err = capsys.readouterr().err.strip()
  assert err == f"jaxpod rl: error: {path}: `rollout.slots` was renamed: write `rollout.batch_size`", err
