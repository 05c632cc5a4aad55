"""`jaxpod data sudoku --out DIR [--box 3x3 --train N --test M --aug K --seed S ...]` and
`jaxpod data sudoku-csv --csv FILE --out DIR [--test_csv FILE --aug K ...]`.

Both write the reference on-disk layout (see `jaxpod.data.sudoku.fmt`) and reuse a folder
that already holds the same build.
"""
from __future__ import annotations

import dataclasses
import sys
import time

from jaxpod.cli.args import parse
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


SUBCOMMANDS = {"sudoku": "generate puzzles (any box shape)", "sudoku-csv": "import a Sudoku-Extreme CSV file"}


def _usage() -> str:
  lines = ["usage: jaxpod data SUBCOMMAND [--OPTION VALUE ...]", "", "subcommands:"]
  return "\n".join(lines + [f"  {k.ljust(10)}  {v}" for k, v in SUBCOMMANDS.items()])


def _summary(out: str, seconds: float) -> str:
  from jaxpod.data.sudoku import fmt
  train, test = fmt.read(out, "train"), fmt.read(out, "test")
  return (f"{out}: {fmt.read_box(out)} boxes, train {len(train)} examples in {train.num_groups} groups, "
          f"test {len(test)} examples, vocab {train.metadata['vocab_size']}, seq_len {train.metadata['seq_len']} "
          f"({seconds:.1f} s)")


def main(argv: list[str]) -> int:
  if not argv or argv[0] in ("-h", "--help", "help"):
    print(_usage())
    return 0
  sub, rest = argv[0], argv[1:]
  if sub not in SUBCOMMANDS:
    print(f"jaxpod data: unknown subcommand {sub!r}\n\n{_usage()}", file=sys.stderr)
    return 2
  from jaxpod.data.sudoku.build import build, import_csv
  start = time.perf_counter()
  try:
    if sub == "sudoku":
      args = parse(SudokuArgs, rest, "jaxpod data sudoku")
      fields = {f.name: getattr(args, f.name) for f in dataclasses.fields(SudokuDataConfig)}
      out = build(SudokuDataConfig(**fields), args.out)
    else:
      a = parse(CsvArgs, rest, "jaxpod data sudoku-csv")
      out = import_csv(a.csv, a.out, test_csv=a.test_csv, test_fraction=a.test_fraction, aug=a.aug, seed=a.seed,
                       subsample=a.subsample, min_rating=a.min_rating)
  except (ValueError, RuntimeError, FileNotFoundError, FileExistsError) as e:
    print(f"jaxpod data {sub}: error: {e}", file=sys.stderr)
    return 2
  print(_summary(out, time.perf_counter() - start))
  return 0
