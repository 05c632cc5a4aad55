"""`jaxpod data ...`: two-step smoke test of each subcommand and one-line errors."""
from __future__ import annotations

from jaxpod.cli.main import main as jaxpod
from jaxpod.data.sudoku import fmt, generate, write_csv


def test_data_sudoku_builds_and_reuses(tmp_path, capsys):
  out = str(tmp_path / "ds")
  argv = ["data", "sudoku", "--out", out, "--box", "2x2", "--train", "10", "--test", "4", "--aug", "2", "--seed", "1"]
  assert jaxpod(argv) == 0
  assert "2x2 boxes, train 30 examples in 10 groups, test 4 examples" in capsys.readouterr().out
  assert jaxpod(argv) == 0  # reused
  assert fmt.read(out, "train").metadata["vocab_size"] == 6


def test_data_sudoku_csv(tmp_path, capsys):
  p = generate(10, "3x3", seed=0)
  csv = str(tmp_path / "train.csv")
  write_csv(csv, p.inputs, p.solutions, p.ratings)
  out = str(tmp_path / "ds")
  assert jaxpod(["data", "sudoku-csv", "--csv", csv, "--out", out, "--test_fraction", "0.2"]) == 0
  assert len(fmt.read(out, "test")) == 2
  (tmp_path / "bad.csv").write_text("source,question,answer,rating\nx,1,2\n")
  assert jaxpod(["data", "sudoku-csv", "--csv", str(tmp_path / "bad.csv"), "--out", str(tmp_path / "b")]) == 2
  assert "bad.csv:2: expected 4 fields" in capsys.readouterr().err


def test_data_errors(capsys):
  assert jaxpod(["data", "sudoku", "--box", "3x3"]) == 2
  assert "--out is required" in capsys.readouterr().err
  assert jaxpod(["data", "nope"]) == 2
  assert jaxpod(["data"]) == 0
