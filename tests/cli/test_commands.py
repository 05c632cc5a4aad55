"""Every command of the table: `--help` works, and a missing or malformed file is one line, exit 2."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from jaxpod.cli.commands import COMMANDS, Command, Group
from jaxpod.cli.main import main


def _paths(table, prefix=()):
  for name, entry in table.items():
    yield (*prefix, name)
    if isinstance(entry, Group):
      yield from _paths(entry.commands, (*prefix, name))


ALL = [()] + list(_paths(COMMANDS))


def _command(path) -> Command | None:
  entry, table = None, COMMANDS
  for name in path:
    entry = table[name]
    table = entry.commands if isinstance(entry, Group) else {}
  return entry.default if isinstance(entry, Group) else entry


WITH_OPTIONS = [p for p in ALL if p and _command(p) is not None and _command(p).config is not None]


@pytest.mark.parametrize("path", ALL, ids=lambda p: " ".join(p) or "jaxpod")
def test_help_of_every_command_exits_0(path, capsys):
  """`jaxpod ... --help` prints a non-empty help (a `%` in a field comment once crashed `train --help`)."""
  assert main([*path, "--help"]) == 0
  out = capsys.readouterr().out
  assert len(out.strip().splitlines()) >= 3, out
  assert "usage:" in out


def test_train_help_keeps_a_literal_percent():
  p = subprocess.run([sys.executable, "-m", "jaxpod.cli.main", "train", "--help"], capture_output=True, text=True,
                     timeout=120)
  assert p.returncode == 0 and "H % KV == 0" in p.stdout, p.stderr[-2000:]


def _one_line_error(capsys, *needles) -> str:
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1, err
  for n in needles:
    assert n in err[0], err[0]
  return err[0]


@pytest.mark.parametrize("path", WITH_OPTIONS, ids=" ".join)
def test_missing_config_file_is_one_line_exit_2(path, tmp_path, capsys):
  missing = str(tmp_path / "nope.yaml")
  assert main([*path, "--config_path", missing]) == 2
  _one_line_error(capsys, f"jaxpod {' '.join(path)}: error:", missing, "does not exist")


@pytest.mark.parametrize("path", WITH_OPTIONS, ids=" ".join)
def test_malformed_config_file_is_one_line_exit_2(path, tmp_path, capsys):
  bad = tmp_path / "bad.yaml"
  bad.write_text("trainer: {steps: [1, 2\n")
  assert main([*path, "--config_path", str(bad)]) == 2
  _one_line_error(capsys, str(bad), "not valid YAML at line 2")
  bad.write_text("- just\n- a list\n")
  assert main([*path, "--config_path", str(bad)]) == 2
  _one_line_error(capsys, str(bad), "not a mapping")


def _file_cases(tmp):
  """(argv, text the one line must hold) for every command that reads a file named on its command line."""
  (tmp / "binary.csv").write_bytes(b"\xff\xfe\x00\x01")
  (tmp / "bad.yaml").write_text("model: [1,\n")
  run = tmp / "run"
  run.mkdir()
  (run / "metrics.jsonl").write_text("not json\n")
  return [
      (["train", "--config_path", str(tmp / "none.yaml")], "none.yaml does not exist"),
      (["sample", "--hf", str(tmp / "none"), "--prompts", str(tmp / "p.txt"), "--out", str(tmp / "o.jsonl")],
       "sample.hf"),
      (["plot", str(tmp / "none")], "metrics.jsonl not found"),
      (["plot", str(run)], "holds no metrics records"),
      (["extract", "--hf", str(tmp / "none"), "--prompts", str(tmp / "p.txt"), "--layers", "1", "--out",
        str(tmp / "acts")], "extract.hf="),
      (["extract", "info", str(tmp / "none")], "no activation dataset"),
      (["data", "sudoku-csv", "--csv", str(tmp / "none.csv"), "--out", str(tmp / "ds")], "none.csv"),
      (["data", "sudoku-csv", "--csv", str(tmp / "binary.csv"), "--out", str(tmp / "ds")], "not a UTF-8 text CSV"),
      (["bench", "trm-step", "--config", str(tmp / "none.yaml")], "none.yaml"),
      (["bench", "trm-step", "--config", str(tmp / "bad.yaml")], "bad.yaml is not valid YAML at line 2"),
      (["launch", "--hosts", "1", "--", str(tmp / "no-such-program")], "no-such-program"),
  ]


def test_missing_or_malformed_files_of_every_command(tmp_path, capsys):
  for argv, needle in _file_cases(tmp_path):
    assert main(argv) == 2, argv
    line = _one_line_error(capsys, needle)
    assert line.startswith("jaxpod "), line


def test_malformed_prompt_files_name_the_line(tmp_path):
  from jaxpod.extract.config import read_prompts as extract_prompts
  from jaxpod.sample.run import read_prompts as sample_prompts
  p = tmp_path / "prompts.jsonl"
  p.write_text(json.dumps({"prompt": "a"}) + "\n{\"prompt\": \n")
  with pytest.raises(ValueError, match=r"sample.prompts=.*prompts.jsonl line 2 is not JSON"):
    sample_prompts(str(p))
  with pytest.raises(ValueError, match=r"extract.prompts=.*prompts.jsonl line 2 is not JSON"):
    extract_prompts(str(p))


def test_unknown_subcommand_lists_the_group(capsys):
  assert main(["bench", "nope"]) == 2
  err = capsys.readouterr().err
  assert "jaxpod bench: unknown command 'nope'" in err and "trm-step" in err


def test_comma_lists_follow_the_field_types():
  from jaxpod.bench.sample.command import SampleBench
  from jaxpod.cli.args import comma_lists, parse
  assert comma_lists(SampleBench, ["--layouts", "slots,paged", "--hidden_size", "8"]) == [
      "--layouts", "[slots,paged]", "--hidden_size", "8"]
  assert parse(SampleBench, ["--layouts=paged,slots"], "t").layouts == ("paged", "slots")


@pytest.mark.multihost
def test_hosts_option_relaunches_under_jaxpod_launch(tmp_path):
  """`jaxpod bench barrier --hosts 2` outside a launch reruns itself as 2 hosts; host 0 reports."""
  out = tmp_path / "barrier.json"
  p = subprocess.run([sys.executable, "-m", "jaxpod.cli.main", "bench", "barrier", "--hosts", "2", "--iters", "5",
                      "--rounds", "1", "--json", str(out)], capture_output=True, text=True, timeout=300)
  assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
  assert json.loads(out.read_text())["hosts"] == 2


def needs_pyarrow(cfg) -> int:
  raise ModuleNotFoundError("No module named 'pyarrow'", name="pyarrow")


def test_a_missing_optional_package_names_its_extra(monkeypatch, capsys):
  monkeypatch.setitem(COMMANDS, "fake", Command("needs pyarrow", "tests.cli.test_commands:needs_pyarrow",
                                                "jaxpod.cli.commands:CacheOptions"))
  assert main(["fake"]) == 2
  _one_line_error(capsys, "jaxpod fake: error: the optional package 'pyarrow' is not installed",
                  "pip install -e '.[transfer]'")
