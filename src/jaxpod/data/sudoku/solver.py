"""Vectorised exact Sudoku solver: candidate bitmasks, singles propagation, per-puzzle DFS.

Every puzzle in a batch is solved at once. Each cell holds a bitmask of its candidate digits
(bit d-1 for digit d). One "tick" of the loop advances every live puzzle by one step:
a propagation pass (naked singles, hidden singles, contradiction checks) while it still
changes something, otherwise a branch on the cell with the fewest candidates (the other
candidates are pushed on that puzzle's own stack) or, on a contradiction or a solution, a
backtrack. The search is exhaustive, so `count` is exact up to `cap`: `cap=2` is the
uniqueness test the generator uses; `cap=1` with an `rng` draws a random full grid.
"""
from __future__ import annotations

import dataclasses
import functools

import numpy as np

from jaxpod.data.sudoku.grid import Box


@functools.lru_cache(maxsize=None)
def _tables(n: int) -> tuple[np.ndarray, np.ndarray]:
  """popcount [2^n] and set-bit positions [2^n, n] (padded with 0) for n-bit masks."""
  masks = np.arange(1 << n)
  bits = (masks[:, None] >> np.arange(n)) & 1  # [2^n, n]
  pop = bits.sum(1).astype(np.int32)
  order = np.argsort(-bits, axis=1, kind="stable").astype(np.int32)  # set bits first
  return pop, order


@dataclasses.dataclass
class SolveResult:
  count: np.ndarray  # int32 [B]: number of solutions found, capped at `cap`
  solutions: np.ndarray  # int8 [B, cap, n*n]: the solutions found (zeros where fewer)
  guesses: np.ndarray  # int32 [B]: branch points visited (0 = solved by singles alone)


def _propagate(cand: np.ndarray, box: Box) -> tuple[np.ndarray, np.ndarray]:
  """One pass of naked + hidden singles over cand [C, B]; returns (new cand, contradiction [B]).

  Cells are the leading axis so that every unit operation is a whole-row array op over B.
  """
  full = (1 << box.n) - 1
  units, cu = box.units, box.cell_units
  single = (cand & (cand - 1)) == 0  # one bit left (an empty cell is caught below)
  fixed = cand * single  # (arithmetic masks: faster than np.where here)
  u_or = np.zeros((units.shape[0], cand.shape[1]), cand.dtype)  # [3n, B]
  u_sum = np.zeros(u_or.shape, np.int32)
  for k in range(box.n):
    f = fixed[units[:, k]]
    u_or |= f
    u_sum += f
  dup = (u_sum != u_or).any(axis=0)  # two fixed cells share a digit
  cand = cand & ~((u_or[cu[:, 0]] | u_or[cu[:, 1]] | u_or[cu[:, 2]]) * ~single)  # singles keep their digit
  once = np.zeros_like(u_or)
  twice = np.zeros_like(u_or)
  for k in range(box.n):
    m = cand[units[:, k]]
    twice |= once & m
    once |= m
  missing = (once != full).any(axis=0)  # a digit with no place left in some unit
  only = once & ~twice  # [3n, B] digits with exactly one place in the unit
  hidden = cand & (only[cu[:, 0]] | only[cu[:, 1]] | only[cu[:, 2]])
  clash = ((hidden & (hidden - 1)) != 0).any(axis=0)  # one cell is the only place for two digits
  cand = cand ^ ((cand ^ hidden) * (hidden != 0))  # hidden single -> that digit
  bad = dup | missing | clash | (cand == 0).any(axis=0)
  return cand, bad


def solve(puzzles: np.ndarray, box: "Box | str", cap: int = 2,
          rng: np.random.Generator | None = None) -> SolveResult:
  """Find up to `cap` solutions of each puzzle (int [B, n*n], 0 blank); random branch order with `rng`."""
  box = Box.parse(box)
  n, cells = box.n, box.cells
  pop, setbits = _tables(n)
  full = (1 << n) - 1
  puzzles = np.asarray(puzzles).reshape(-1, cells)
  b = puzzles.shape[0]
  digits = puzzles.T.astype(np.int32)  # [C, B]
  cur = np.where(digits > 0, 1 << np.maximum(digits - 1, 0), full).astype(np.uint16)  # [C, B]
  count = np.zeros(b, np.int32)
  guesses = np.zeros(b, np.int32)
  sols = np.zeros((b, cap, cells), np.int8)
  stack = np.zeros((4, cells, b), np.uint16)  # [depth, C, B]: pushed alternatives per puzzle
  sp = np.zeros(b, np.int32)
  ids = np.arange(b)  # puzzle of each live column of cur
  while ids.size:
    new, bad = _propagate(cur, box)
    solved = ~bad & ((new & (new - 1)) == 0).all(axis=0)
    if solved.any():  # singles set in this pass may still clash: check every unit is complete
      idx = np.flatnonzero(solved)
      u_or = np.bitwise_or.reduce(new[:, idx][box.units], axis=1)  # [3n, S]
      wrong = idx[(u_or != full).any(axis=0)]
      bad[wrong], solved[wrong] = True, False
    branch = ~bad & ~solved & ~(new != cur).any(axis=0)  # at a fixpoint: guess
    cur = new
    if solved.any():
      rows = ids[solved]
      sols[rows, count[rows]] = (np.log2(new[:, solved]).astype(np.int8) + 1).T
      count[rows] += 1
    if branch.any():
      col = np.flatnonzero(branch)
      rows, nb = ids[col], new[:, col]  # nb [C, R]
      p = pop[nb]
      key = np.where(p > 1, p, n + 1).astype(np.float32)
      if rng is not None:
        key += rng.random(key.shape, np.float32) * 0.5
      cell = np.argmin(key, axis=0)  # [R]
      masks = nb[cell, np.arange(rows.size)]
      pick = 0 if rng is None else (rng.random(rows.size) * pop[masks]).astype(np.int32)
      bit = (1 << setbits[masks, pick]).astype(np.uint16)
      if sp[rows].max() + 1 >= stack.shape[0]:
        stack = np.concatenate([stack, np.zeros_like(stack)], axis=0)
      nb[cell, np.arange(rows.size)] = masks & ~bit
      stack[sp[rows], :, rows] = nb.T
      sp[rows] += 1
      cur[cell, col] = bit
      guesses[rows] += 1
    back = bad | solved
    if back.any():
      col = np.flatnonzero(back)
      rows = ids[col]
      resume = (sp[rows] > 0) & (count[rows] < cap)
      col, rows = col[resume], rows[resume]
      sp[rows] -= 1
      cur[:, col] = stack[sp[rows], :, rows].T
      keep = ~back
      keep[col] = True
      if not keep.all():
        cur, ids = cur[:, keep], ids[keep]
  return SolveResult(count=count, solutions=sols, guesses=guesses)
