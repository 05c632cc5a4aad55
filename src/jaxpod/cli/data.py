"""`jaxpod data sudoku --out DIR [--box 3x3 --train N --test M --aug K --seed S ...]` and
`jaxpod data sudoku-csv --csv FILE --out DIR [--test_csv FILE --aug K ...]`, and
`jaxpod data word-problems --out DIR [--problems N --sft M --teacher_wrong_op P]`.

Both write the reference on-disk layout (see `jaxpod.data.sudoku.fmt`) and reuse a folder
that already holds the same build.
"""
from __future__ import annotations

import dataclasses
import time

from jaxpod.data.sudoku.build import SudokuDataConfig


@dataclasses.dataclass(frozen=True)
class SudokuArgs(SudokuDataConfig):
  """Generated puzzles: the dataset fields plus where to write them."""

  out: str = ""  # dataset folder to write

  def __post_init__(self):
    super().__post_init__()
    if not self.out:
      raise ValueError("--out is required: the dataset folder to write, e.g. --out data/sudoku-9x9")


@dataclasses.dataclass(frozen=True)
class CsvArgs:
  """Sudoku-Extreme CSV import."""

  csv: str = ""  # train CSV (source,question,answer,rating)
  out: str = ""  # dataset folder to write
  test_csv: str | None = None  # test CSV; without it, test_fraction of --csv is held out
  test_fraction: float = 0.1  # share of --csv rows held out when there is no --test_csv
  aug: int = 0  # augmentations per train puzzle
  seed: int = 0  # split, subsample and augmentation seed
  subsample: int | None = None  # keep this many train puzzles (after min_rating)
  min_rating: int = 0  # drop train puzzles rated below this

  def __post_init__(self):
    if not self.csv:
      raise ValueError("--csv is required: a Sudoku-Extreme CSV file (source,question,answer,rating)")
    if not self.out:
      raise ValueError("--out is required: the dataset folder to write")
    if self.aug < 0:
      raise ValueError(f"--aug must be >= 0, got {self.aug}")


def _summary(out: str, seconds: float) -> str:
  from jaxpod.data.sudoku import fmt
  train, test = fmt.read(out, "train"), fmt.read(out, "test")
  return (f"{out}: {fmt.read_box(out)} boxes, train {len(train)} examples in {train.num_groups} groups, "
          f"test {len(test)} examples, vocab {train.metadata['vocab_size']}, seq_len {train.metadata['seq_len']} "
          f"({seconds:.1f} s)")


def sudoku(args: SudokuArgs) -> int:
  """`jaxpod data sudoku`: generate, write, print a summary."""
  from jaxpod.data.sudoku.build import build
  start = time.perf_counter()
  fields = {f.name: getattr(args, f.name) for f in dataclasses.fields(SudokuDataConfig)}
  try:
    out = build(SudokuDataConfig(**fields), args.out)
  except RuntimeError as e:  # too few distinct puzzles for the sizes asked: bad input, one line
    raise ValueError(str(e)) from e
  print(_summary(out, time.perf_counter() - start))
  return 0


def sudoku_csv(a: CsvArgs) -> int:
  """`jaxpod data sudoku-csv`: import, write, print a summary."""
  from jaxpod.data.sudoku.build import import_csv
  start = time.perf_counter()
  try:
    out = import_csv(a.csv, a.out, test_csv=a.test_csv, test_fraction=a.test_fraction, aug=a.aug, seed=a.seed,
                     subsample=a.subsample, min_rating=a.min_rating)
  except UnicodeDecodeError:
    files = " or ".join(f for f in (a.csv, a.test_csv) if f)
    raise ValueError(f"{files} is not a UTF-8 text CSV (source,question,answer,rating)") from None
  print(_summary(out, time.perf_counter() - start))
  return 0


def word_problems(cfg) -> int:
  """`jaxpod data word-problems`: write problems.jsonl and sft.jsonl, print their row counts."""
  from jaxpod.data.word_problems import build
  counts = build(cfg)
  print(f"{cfg.out}: problems.jsonl {counts['problems']} rows (RL prompts), sft.jsonl {counts['sft']} rows "
        f"(warm-up demonstrations, carry slips {cfg.teacher_carry_slip:.0%})")
  return 0
