"""Reference on-disk format and Sudoku-Extreme CSV import: round trips and row-level errors."""
from __future__ import annotations

import json

import numpy as np
import pytest

from jaxpod.data.sudoku import generate, import_csv, read, read_box, read_csv, write_csv
from jaxpod.data.sudoku import fmt
from jaxpod.data.sudoku.loader import SudokuLoader


def _reference_folder(root, inputs, labels, groups):
  """A folder laid out exactly as the reference builder writes it (no jaxpod files)."""
  e = len(inputs)
  for split, (x, y, g) in {"train": (inputs, labels, groups), "test": (inputs[:3], labels[:3], [1, 1, 1])}.items():
    d = root / split
    d.mkdir(parents=True)
    n = len(x)
    np.save(d / "all__inputs.npy", (x + 1).astype(np.uint8))
    np.save(d / "all__labels.npy", (y + 1).astype(np.uint8))
    np.save(d / "all__puzzle_identifiers.npy", np.zeros(n, np.int32))
    np.save(d / "all__puzzle_indices.npy", np.arange(n + 1, dtype=np.int32))
    np.save(d / "all__group_indices.npy", np.concatenate([[0], np.cumsum(g)]).astype(np.int32))
    meta = {"pad_id": 0, "ignore_label_id": 0, "blank_identifier_id": 0, "vocab_size": 11, "seq_len": 81,
            "num_puzzle_identifiers": 1, "total_groups": len(g), "mean_puzzle_examples": 1, "sets": ["all"]}
    (d / "dataset.json").write_text(json.dumps(meta))
  (root / "identifiers.json").write_text(json.dumps(["<blank>"]))
  assert e == sum(groups)


def test_reference_folder_loads_unchanged(tmp_path):
  """A dataset written by the reference builder reads and batches without any jaxpod sidecar."""
  p = generate(4, "3x3", seed=0)
  inputs, labels = np.repeat(p.inputs, 2, 0), np.repeat(p.solutions, 2, 0)
  _reference_folder(tmp_path, inputs, labels, [2, 2, 2, 2])
  s = read(str(tmp_path), "train")
  assert s.num_groups == 4 and s.inputs.dtype == np.uint8 and (fmt.decode(s.inputs) == inputs).all()
  assert str(read_box(str(tmp_path))) == "3x3"
  batch = next(SudokuLoader(str(tmp_path), 4, shard_index=0, shard_count=1).train_iter())
  assert batch["inputs"].shape == (4, 81) and batch["labels"].min() >= 2 and batch["inputs"].max() <= 10


def test_write_read_round_trip(tmp_path):
  p = generate(6, "2x3", seed=1)
  split = fmt.make_split(p.inputs, p.solutions, np.array([2, 1, 3]), fmt.Box.parse("2x3"))
  fmt.write(str(tmp_path), {"train": split, "test": split}, {"box": "2x3"})
  back = read(str(tmp_path), "test")
  for f in fmt.FIELDS:
    assert (getattr(back, f) == getattr(split, f)).all() and getattr(back, f).dtype == getattr(split, f).dtype
  assert back.metadata == split.metadata and back.metadata["vocab_size"] == 8
  assert list(back.group_indices) == [0, 2, 3, 6] and list(back.puzzle_indices) == list(range(7))
  assert json.loads((tmp_path / "identifiers.json").read_text()) == ["<blank>"]
  with pytest.raises(FileNotFoundError, match="dataset.json"):
    read(str(tmp_path / "nope"), "train")


def test_csv_round_trip_and_import(tmp_path):
  p = generate(20, "3x3", seed=2)
  path = str(tmp_path / "train.csv")
  write_csv(path, p.inputs, p.solutions, p.ratings)
  assert open(path).readline().strip() == "source,question,answer,rating"
  back = read_csv(path)
  assert (back.inputs == p.inputs).all() and (back.solutions == p.solutions).all() and (back.ratings == p.ratings).all()
  out = import_csv(path, str(tmp_path / "ds"), test_fraction=0.25, aug=2, seed=0)
  train, test = read(out, "train"), read(out, "test")
  assert len(test) == 5 and len(train) == 15 * 3 and train.num_groups == 15
  assert import_csv(path, str(tmp_path / "ds"), test_fraction=0.25, aug=2, seed=0) == out  # reused


GOOD_Q = "." * 80 + "1"


@pytest.mark.parametrize("row,reason", [
    ("x,1,2", "expected 4 fields"),
    ("x,123,{a},0", "question has 3 characters"),
    ("x,{q},{a},hard", "rating 'hard' is not an integer"),
    ("x,{bad},{a},0", "question has 'z' at position 5"),
    ("x,{q},{a0},0", "answer has '0'"),
    ("x,{q},{arow},0", "answer is not a valid solved grid"),
    ("x,{qwrong},{a},0", "clue that differs from the answer"),
])
def test_csv_bad_rows_name_file_line_reason(tmp_path, row, reason):
  """A malformed row is reported with its file, its line number and what is wrong."""
  p = generate(1, "3x3", seed=0)
  a = "".join(map(str, p.solutions[0]))
  q = "".join("." if d == 0 else str(d) for d in p.inputs[0])
  wrong = str(p.solutions[0][0] % 9 + 1)
  fields = {"q": q, "a": a, "bad": q[:4] + "z" + q[5:], "a0": "0" + a[1:], "arow": a[1] + a[0] + a[2:],
            "qwrong": wrong + "." * 80}
  path = tmp_path / "bad.csv"
  path.write_text(f"source,question,answer,rating\nok,{q},{a},0\n{row.format(**fields)}\n")
  with pytest.raises(ValueError) as e:
    read_csv(str(path))
  assert str(e.value).startswith(f"{path}:3: ") and reason in str(e.value)


def test_csv_bad_header(tmp_path):
  path = tmp_path / "h.csv"
  path.write_text("id,puzzle,solution\n")
  with pytest.raises(ValueError, match=r"h.csv:1: header must be source,question,answer,rating"):
    read_csv(str(path))
