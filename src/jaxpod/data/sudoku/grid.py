"""Sudoku geometry for any box shape: cells, units (rows, columns, boxes) and validity checks.

A grid of box shape `r x c` has side `n = r * c`: `c` bands of `r` rows and `r` stacks of `c`
columns. Boards are flat `[B, n*n]` integer arrays in row-major order; 0 is a blank and
1..n are digits (the on-disk encoding, digit + 1, lives in `fmt.py`).
"""
from __future__ import annotations

import dataclasses
import functools

import numpy as np


@dataclasses.dataclass(frozen=True)
class Box:
  """Box shape `rows x cols` (3x3 -> 9x9 grid, 2x3 -> 6x6 grid, 2x2 -> 4x4 grid)."""

  rows: int = 3  # rows per box (= rows per band)
  cols: int = 3  # columns per box (= columns per stack)

  def __post_init__(self):
    if self.rows < 1 or self.cols < 1 or self.rows * self.cols < 2 or self.rows * self.cols > 16:
      raise ValueError(f"box must be RxC with 2 <= R*C <= 16, got {self.rows}x{self.cols}; try --box 3x3")

  @classmethod
  def parse(cls, spec: "str | Box") -> "Box":
    """'3x3' -> Box(3, 3); a Box passes through."""
    if isinstance(spec, Box):
      return spec
    try:
      r, c = (int(p) for p in str(spec).lower().split("x"))
    except ValueError:
      raise ValueError(f"box must look like '3x3' or '2x3', got {spec!r}") from None
    return cls(r, c)

  @classmethod
  def for_side(cls, n: int) -> "Box":
    """The box for an n x n grid with the most square box (rows <= cols): 9 -> 3x3, 6 -> 2x3."""
    r = max(d for d in range(1, int(n**0.5) + 1) if n % d == 0)
    return cls(r, n // r)

  @property
  def n(self) -> int:
    return self.rows * self.cols

  @property
  def cells(self) -> int:
    return self.n * self.n

  def __str__(self) -> str:
    return f"{self.rows}x{self.cols}"

  @functools.cached_property
  def units(self) -> np.ndarray:
    """int [3n, n]: cell indices of each row, then each column, then each box."""
    n, r, c = self.n, self.rows, self.cols
    idx = np.arange(n * n).reshape(n, n)
    boxes = [idx[br * r:(br + 1) * r, bc * c:(bc + 1) * c].ravel() for br in range(c) for bc in range(r)]
    return np.concatenate([idx, idx.T, np.stack(boxes)]).astype(np.intp)

  @functools.cached_property
  def cell_units(self) -> np.ndarray:
    """int [n*n, 3]: the row, column and box unit index of each cell."""
    out = np.zeros((self.cells, 3), np.intp)
    for u, members in enumerate(self.units):
      out[members, u // self.n] = u
    return out


def is_solution(grids: np.ndarray, box: Box) -> np.ndarray:
  """bool [B]: each full grid holds every digit exactly once in every row, column and box."""
  grids = np.asarray(grids).reshape(-1, box.cells)
  units = np.sort(grids[:, box.units], axis=-1)  # [B, 3n, n]
  return (units == np.arange(1, box.n + 1)).all(axis=(1, 2))


def agrees(puzzles: np.ndarray, solutions: np.ndarray) -> np.ndarray:
  """bool [B]: every clue (non-zero) of each puzzle equals its solution's digit."""
  puzzles, solutions = np.asarray(puzzles), np.asarray(solutions)
  return ((puzzles == 0) | (puzzles == solutions)).all(axis=-1)
