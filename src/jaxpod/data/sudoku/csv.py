"""Sudoku-Extreme CSV format: `source,question,answer,rating`, one board per row.

`question` and `answer` are n*n characters in row-major order, '.' (or '0') for a blank,
'1'..'9' for digits (so grids up to 9x9); `rating` is an integer (backtracks of the
benchmark's reference solver). Every malformed row raises ValueError naming the file, the
line number (1-based, header = line 1) and the reason.
"""
from __future__ import annotations

import csv as _csv
import dataclasses
import io

import fsspec
import numpy as np

from jaxpod.data.sudoku.grid import Box, agrees, is_solution

HEADER = ["source", "question", "answer", "rating"]


@dataclasses.dataclass
class CsvPuzzles:
  """Rows of a Sudoku-Extreme CSV file, as digits (0 = blank)."""

  sources: list[str]
  inputs: np.ndarray  # int8 [R, n*n]
  solutions: np.ndarray  # int8 [R, n*n]
  ratings: np.ndarray  # int32 [R]
  box: Box


def _digits(strings: list[str], blank_ok: bool, n: int, path: str, what: str) -> np.ndarray:
  """Strings of equal length -> int8 [R, L]; ValueError at the first bad character."""
  raw = np.frombuffer("".join(strings).encode("ascii", "replace"), np.uint8).reshape(len(strings), -1)
  vals = raw.astype(np.int16) - ord("0")
  if blank_ok:
    vals = np.where(raw == ord("."), 0, vals)
  ok = (vals >= (0 if blank_ok else 1)) & (vals <= n)
  bad = np.flatnonzero(~ok.all(axis=1))
  if bad.size:
    r = int(bad[0])
    col = int(np.flatnonzero(~ok[r])[0])
    allowed = f"'.' or 1..{n}" if blank_ok else f"1..{n}"
    raise ValueError(f"{path}:{r + 2}: {what} has {strings[r][col]!r} at position {col + 1}; expected {allowed}")
  return vals.astype(np.int8)


def read_csv(path: str, box: "Box | str | None" = None) -> CsvPuzzles:
  """Parse and validate a Sudoku-Extreme CSV file (any fsspec path)."""
  with fsspec.open(path, "r", newline="") as f:
    rows = list(_csv.reader(f))
  if not rows or [h.strip() for h in rows[0]] != HEADER:
    got = ",".join(rows[0]) if rows else "an empty file"
    raise ValueError(f"{path}:1: header must be {','.join(HEADER)}, got {got}")
  rows = rows[1:]
  if not rows:
    raise ValueError(f"{path}:2: no puzzles after the header")
  for i, row in enumerate(rows):
    if len(row) != 4:
      raise ValueError(f"{path}:{i + 2}: expected 4 fields ({','.join(HEADER)}), got {len(row)}")
  cells = len(rows[0][1])
  side = int(round(cells**0.5))
  box = Box.parse(box) if box is not None else (Box.for_side(side) if side * side == cells and side >= 2 else None)
  if box is None or box.cells != cells:
    raise ValueError(f"{path}:2: question has {cells} characters; expected a square grid like 81 (9x9)")
  if box.n > 9:
    raise ValueError(f"{path}: {box} grids need digits above 9, which this format cannot write")
  ratings = np.zeros(len(rows), np.int32)
  for i, row in enumerate(rows):
    line = i + 2
    for what, s in (("question", row[1]), ("answer", row[2])):
      if len(s) != cells:
        raise ValueError(f"{path}:{line}: {what} has {len(s)} characters; expected {cells}")
    try:
      ratings[i] = int(row[3])
    except ValueError:
      raise ValueError(f"{path}:{line}: rating {row[3]!r} is not an integer") from None
  inputs = _digits([r[1] for r in rows], True, box.n, path, "question")
  solutions = _digits([r[2] for r in rows], False, box.n, path, "answer")
  for mask, reason in ((is_solution(solutions, box), "answer is not a valid solved grid (a digit repeats in a row, column or box)"),
                       (agrees(inputs, solutions), "question has a clue that differs from the answer")):
    if not mask.all():
      raise ValueError(f"{path}:{int(np.flatnonzero(~mask)[0]) + 2}: {reason}")
  return CsvPuzzles([r[0] for r in rows], inputs, solutions, ratings, box)


def write_csv(path: str, inputs: np.ndarray, solutions: np.ndarray, ratings: np.ndarray,
              sources: list[str] | None = None) -> None:
  """Write digit boards (0 blank, 1..9) as a Sudoku-Extreme CSV file."""
  buf = io.StringIO()
  w = _csv.writer(buf, lineterminator="\n")
  w.writerow(HEADER)
  for i, (q, a, r) in enumerate(zip(np.asarray(inputs), np.asarray(solutions), np.asarray(ratings))):
    question = "".join("." if d == 0 else str(int(d)) for d in q)
    w.writerow([sources[i] if sources else "jaxpod", question, "".join(str(int(d)) for d in a), int(r)])
  with fsspec.open(path, "w") as f:
    f.write(buf.getvalue())
