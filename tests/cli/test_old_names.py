"""One name per thing (issue 49): every renamed option still works, on the command line and in a `--config_path`
file, gives the config its new name gives, and warns once (naming the new name) on stderr.

    start checkpoint   sample/extract `--model`, causal LM `--task.init_from`  ->  `--hf`, `--task.hf` (rl: `model.hf`)
    adapter            `--task.adapter_from` (causal LM, preference)          ->  `--task.adapter` (sample/extract's)
    LoRA's lr rule     preference `--task.lora_lr_scale`, `lora_b_lr_ratio`   ->  `--task.lora.lr_scale`, `.b_lr_ratio`
    problem set        `jaxpod rl --task.*`, `task:`                          ->  `--problems.*`, `problems:`
"""
from __future__ import annotations

import pytest
import yaml

from jaxpod.cli import args as args_lib


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
  """Each test starts as a fresh process does: no old name warned about yet."""
  monkeypatch.setattr(args_lib, "_warned", set())


def _warnings(capsys) -> list[str]:
  return [line for line in capsys.readouterr().err.splitlines() if "warning" in line]


def _train(*argv: str):
  from jaxpod.cli.train import load_config
  return load_config(["--trainer.runs_dir", "/nonexistent/runs", *argv])


def _rl(*argv: str):
  from jaxpod.cli.rl import load_config
  return load_config(list(argv))


def test_sample_model_is_now_hf(capsys):
  from jaxpod.sample.config import SampleConfig
  old = args_lib.parse(SampleConfig, ["--model", "ckpt/", "--prompts", "p.txt", "--out", "o.jsonl"], "jaxpod sample")
  assert old.hf == "ckpt/"
  assert _warnings(capsys) == ["jaxpod sample: warning: --model is now --hf (the old name still works)"]
  assert old == args_lib.parse(SampleConfig, ["--hf", "ckpt/", "--prompts", "p.txt", "--out", "o.jsonl"], "x")
  assert _warnings(capsys) == []


def test_extract_model_is_now_hf_and_mesh_model_is_not_renamed(capsys):
  from jaxpod.extract.config import ExtractConfig
  base = ["--prompts", "p.txt", "--layers", "1", "--out", "o", "--mesh.model", "1"]
  old = args_lib.parse(ExtractConfig, ["--model=ckpt/", *base], "jaxpod extract")
  assert old.hf == "ckpt/" and old.mesh.model == 1
  assert _warnings(capsys) == ["jaxpod extract: warning: --model is now --hf (the old name still works)"]
  assert old == args_lib.parse(ExtractConfig, ["--hf=ckpt/", *base], "jaxpod extract")


def test_causal_lm_init_from_is_now_hf(tmp_path, capsys):
  from tests.models.llama.hf_checkpoints import write_hf_checkpoint
  write_hf_checkpoint(tmp_path / "base")
  lm = ["--task.type", "causal_lm", "--task.data.seq_len", "32", "--task.sample.max_prompt_len", "16",
        "--task.sample.max_new_tokens", "8"]
  old = _train(*lm, "--task.init_from", str(tmp_path / "base"))
  assert old.task.hf == str(tmp_path / "base")
  assert _warnings(capsys) == ["jaxpod train: warning: --task.init_from is now --task.hf (the old name still works)"]
  assert old == _train(*lm, "--task.hf", str(tmp_path / "base"))


@pytest.mark.parametrize("task", ["causal_lm", "preference"])
def test_adapter_from_is_now_adapter(task, tmp_path, capsys):
  """The value reaches `task.adapter`: without `task.hf` the one error names the new field."""
  from jaxpod.cli.args import UsageError
  with pytest.raises(UsageError):
    _train("--task.type", task, "--task.adapter_from", str(tmp_path / "adapter"))
  err = capsys.readouterr().err.splitlines()
  assert err == ["jaxpod train: warning: --task.adapter_from is now --task.adapter (the old name still works)",
                 f"jaxpod train: error: task.adapter={tmp_path / 'adapter'} needs task.hf: the base checkpoint it was "
                 "trained on"], err


def test_preference_lora_rates_moved_into_the_lora_section(capsys):
  old = _train("--task.type", "preference", "--task.lora.rank", "8", "--task.lora_lr_scale", "3.5",
               "--task.lora_b_lr_ratio", "2")
  assert (old.task.lora.lr_scale, old.task.lora.b_lr_ratio) == (3.5, 2.0)
  assert _warnings(capsys) == [
      "jaxpod train: warning: --task.lora_lr_scale is now --task.lora.lr_scale (the old name still works)",
      "jaxpod train: warning: --task.lora_b_lr_ratio is now --task.lora.b_lr_ratio (the old name still works)"]
  assert old == _train("--task.type", "preference", "--task.lora.rank", "8", "--task.lora.lr_scale", "3.5",
                       "--task.lora.b_lr_ratio", "2")


def test_rl_task_is_now_problems_warned_once_for_every_field_under_it(capsys):
  """`--task.type` picks the problem set's embedded default as `--problems.type` does (the calculator's)."""
  old = _rl("--task.type", "calculator", "--task.digits", "3")
  assert type(old.problems).__name__ == "CalculatorProblems" and old.problems.digits == 3
  assert old.rollout.max_prompt_len == 48  # rl_calculator.yaml's, not rl_default.yaml's 16
  assert _warnings(capsys) == ["jaxpod rl: warning: --task.type is now --problems.type (the old name still works)"]
  assert old == _rl("--problems.type", "calculator", "--problems.digits", "3")


def test_old_keys_in_a_config_file_are_read_under_their_new_names(tmp_path, capsys):
  rl_file, train_file = tmp_path / "rl.yaml", tmp_path / "train.yaml"
  rl_file.write_text(yaml.safe_dump({"task": {"type": "addition", "digits": 2}, "trainer": {"steps": 7}}))
  train_file.write_text(yaml.safe_dump({"task": {"type": "preference", "lora": {"rank": 4}, "lora_lr_scale": 3.0}}))
  got = _rl("--config_path", str(rl_file))
  assert type(got.problems).__name__ == "AdditionProblems" and got.problems.digits == 2 and got.trainer.steps == 7
  pref = _train(f"--config_path={train_file}")
  assert pref.task.lora.rank == 4 and pref.task.lora.lr_scale == 3.0
  assert _warnings(capsys) == [
      f"jaxpod rl: warning: {rl_file}: `task` is now `problems` (the old name still works)",
      f"jaxpod train: warning: {train_file}: `task.lora_lr_scale` is now `task.lora.lr_scale` (the old name still "
      "works)"]
