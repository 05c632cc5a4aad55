"""The `dataset` task: `jaxpod rl --problems.type dataset --problems.path FILE` trains on a user's prompt file,
holds out part of it, and judges answers with the configured verifier."""
import json
from pathlib import Path

import draccus
import pytest

from jaxpod.rl.config import RLConfig
from jaxpod.problems.dataset import DatasetProblems
from tests.rl.clusters import TINY

WORKERS = Path(__file__).parent / "workers"

# A chat template that shows the user's content alone: a byte-level policy trained on "a+b=" prompts
# reads message prompts rendered through it as the same text.
PLAIN_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def _addition_file(path, messages: bool = False) -> str:
  with open(path, "w") as f:
    for a in range(10):
      for b in range(10):
        prompt = [{"role": "user", "content": f"{a}+{b}="}] if messages else f"{a}+{b}="
        f.write(json.dumps({"prompt": prompt, "answer": a + b}) + "\n")
  return str(path)


def _dataset_args(path: str) -> list[str]:
  args = list(TINY)
  args[args.index("addition")] = "dataset"
  at = args.index("--problems.digits")
  del args[at:at + 2]
  return [*args, "--problems.path", path]


def test_task_type_dataset_parses_from_the_command_line(tmp_path):
  path = _addition_file(tmp_path / "p.jsonl")
  cfg = draccus.parse(RLConfig, args=["--problems.type", "dataset", "--problems.path", path,
                                      "--problems.prompt_column", "prompt", "--problems.verifier", "gsm8k"])
  assert isinstance(cfg.problems, DatasetProblems) and cfg.problems.path == path
  assert cfg.problems.correct_reward == "gsm8k"


@pytest.mark.parametrize("fields, message", [({"path": ""}, "rl.problems.path is empty"),
                                             ({"prompt_format": "Q: {question}"}, "must contain {prompt}"),
                                             ({"verifier": "regex"}, "rl.problems.verifier='regex'")])
def test_bad_dataset_fields_fail_in_one_line_naming_the_field(fields, message):
  with pytest.raises(ValueError, match=message):
    DatasetProblems(**{"path": "p.jsonl", **fields})


def test_training_streams_walk_every_training_row_once_per_epoch_and_never_a_held_out_one(tmp_path):
  task = DatasetProblems(path=_addition_file(tmp_path / "p.jsonl"), eval_size=20)
  held = {p.prompt for p in task.eval_set(seed=0)}
  epoch = task.train_problems(seed=0, stream=2, start=0, count=80)
  assert len(held) == 20 and len({p.prompt for p in epoch}) == 80 and not held & {p.prompt for p in epoch}
  assert task.train_problems(seed=0, stream=2, start=0, count=80) == epoch  # a pure function of (seed, stream, index)
  assert [p.prompt for p in task.train_problems(0, 2, 80, 80)] != [p.prompt for p in epoch]  # a fresh order per epoch
  assert {p.prompt for p in task.eval_set(seed=1)} == held  # the split belongs to the file, not the seed


def test_the_verifier_decides_what_held_out_accuracy_counts(tmp_path):
  from jaxpod.problems.rewards import Scorer
  from jaxpod.problems.base import Problem
  task = DatasetProblems(path=_addition_file(tmp_path / "p.jsonl"), verifier="gsm8k")
  problem = Problem("3+4=", "7")
  scorer = Scorer(["gsm8k"], [], task)
  assert scorer.correct(problem, "3+4=7\n#### 7", True) and not scorer.correct(problem, "7", True)
  assert Scorer(["exact_match"], [], DatasetProblems(path=task.path)).correct(problem, "7", True)


def test_message_prompts_use_model_hf_chat_template_unless_one_is_named(tmp_path):
  path = _addition_file(tmp_path / "p.jsonl", messages=True)
  cfg = draccus.parse(RLConfig, args=["--problems.type", "dataset", "--problems.path", path, "--model.hf", "/ckpt"])
  assert cfg.problems.chat_template == "/ckpt"
  cfg = draccus.parse(RLConfig, args=["--problems.type", "dataset", "--problems.path", path, "--model.hf", "/ckpt",
                                      "--problems.chat_template", "/other"])
  assert cfg.problems.chat_template == "/other"


def test_a_bad_row_fails_in_one_line_naming_file_and_row(tmp_path, capsys):
  from jaxpod.cli.main import main
  path = tmp_path / "p.jsonl"
  _addition_file(path)
  with open(path, "a") as f:
    f.write(json.dumps({"prompt": "", "answer": 1}) + "\n")
  assert main(["rl", *_dataset_args(str(path)), "--trainer.runs_dir", str(tmp_path / "runs")]) == 2
  err = capsys.readouterr().err.strip()
  assert "p.jsonl row 100 column 'prompt': the prompt is empty" in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("args, message", [(["--eval.k", "4", "--eval.samples", "2"], "pass@k needs n >= k"),
                                           (["--eval.samples", "2"], "without eval.k")])
def test_pass_at_k_needs_at_least_k_samples_per_problem(args, message, capsys, tmp_path):
  from jaxpod.cli.main import main
  assert main(["rl", "--trainer.runs_dir", str(tmp_path), *args]) == 2
  err = capsys.readouterr().err.strip()
  assert message in err and len(err.splitlines()) == 1, err


def test_jaxpod_rl_trains_on_chat_message_prompts_from_a_file(tmp_path, warm_policy):
  """End to end: the session's warm policy, prompts as chat messages rendered with a template, 2 GRPO steps,
  held-out pass@1 and pass@2 from 4 samples per problem beside greedy accuracy."""
  from jaxpod.rl.run import run
  path = _addition_file(tmp_path / "p.jsonl", messages=True)
  (tmp_path / "template").mkdir()
  (tmp_path / "template" / "chat_template.jinja").write_text(PLAIN_TEMPLATE)
  cfg = draccus.parse(RLConfig, args=[*_dataset_args(path), "--model.hf", warm_policy, "--problems.chat_template",
                                      str(tmp_path / "template"), "--trainer.steps", "2", "--trainer.eval_every", "2",
                                      "--eval.k", "2", "--eval.samples", "4",
                                      "--trainer.runs_dir", str(tmp_path / "runs")])
  summary = run(cfg)
  assert summary["steps"] == 2 and len(summary["reward_curve"]) == 2
  # the warm policy learnt "a+b=" -> sum; the rendered message prompts are that text, so it answers many correctly
  assert summary["accuracy.start"] > 0.1
  passk = summary["pass_at_k"]
  assert (passk["k"], passk["samples"]) == (2, 4) and [s for s, _ in passk["pass@2"]["curve"]] == [0, 2]
  for v in ("start", "end"):
    assert 0.0 < passk["pass@1"][v] <= passk["pass@2"][v] <= 1.0  # more tries never pass less often


@pytest.mark.multihost
def test_hosts_that_read_different_prompt_files_stop_at_setup_naming_the_host(launch_hosts):
  """Invariant 1: every host samples the same prompts, so every host must have read the same file. Each simulated
  host reads problems.jsonl from its own disk; one stale copy on host 1 stops every host in one line."""
  from tests.conftest import host_lines
  agreed = launch_hosts(WORKERS / "prompt_file_worker.py", hosts=2, devices_per_host=1, args=["same"])
  assert agreed.returncode == 0 and all(host_lines(agreed, h, "AGREED") == [""] for h in (0, 1)), agreed.transcript
  stale = launch_hosts(WORKERS / "prompt_file_worker.py", hosts=2, devices_per_host=1, args=["stale"])
  assert stale.returncode == 2, stale.transcript
  for h in (0, 1):
    (line,) = host_lines(stale, h, "REFUSED")
    assert line.startswith("rl.problems: trainer host(s) [1] read other problems from problems.jsonl than host 0")
