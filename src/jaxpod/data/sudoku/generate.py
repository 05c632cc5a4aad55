"""Offline Sudoku generator for any box shape, deterministic by seed.

Pipeline, vectorised over the whole batch:
1. random full grids: the boxes on the diagonal are independent, so they get random digit
   permutations; the exact solver (`solver.py`) completes the rest with random branch order;
2. clues: keep a random `clues`-sized subset of cells (the difficulty knob: fewer is harder),
   then repair: while a puzzle has a second solution, reveal one random cell where its two
   solutions differ (each repair removes that alternative, so this terminates);
3. optional `minimize`: try removing every clue once, in random order, keeping a removal
   only when the solution stays unique (minimal puzzles, the hardest for their grid);
4. `rating` = branch points the solver needs to prove uniqueness (0 = singles suffice), the
   analogue of Sudoku-Extreme's backtrack rating; `min_rating` keeps only harder puzzles.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from jaxpod.data.sudoku.grid import Box
from jaxpod.data.sudoku.solver import solve

# Default clue target per grid side: a little under where puzzles become unique, so the
# repair step adds a few clues (fewer rounds of the solver than starting lower).
DEFAULT_CLUES = {4: 4, 6: 8, 8: 16, 9: 28, 10: 34, 12: 56, 16: 120}


@dataclasses.dataclass
class Puzzles:
  """A batch of puzzles with unique solutions (digits 1..n, 0 = blank)."""

  inputs: np.ndarray  # int8 [P, n*n]
  solutions: np.ndarray  # int8 [P, n*n]
  ratings: np.ndarray  # int32 [P]: solver branch points to prove uniqueness

  def __len__(self) -> int:
    return len(self.inputs)

  def take(self, idx) -> "Puzzles":
    """The puzzles at `idx` (any numpy index)."""
    return Puzzles(self.inputs[idx], self.solutions[idx], self.ratings[idx])

  @staticmethod
  def concat(parts: "list[Puzzles]") -> "Puzzles":
    """One batch from several."""
    return Puzzles(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("inputs", "solutions", "ratings")))


def random_grids(num: int, box: Box, rng: np.random.Generator) -> np.ndarray:
  """int8 [num, n*n] random full grids (random diagonal boxes, random completion; not exactly uniform)."""
  box = Box.parse(box)
  seed = np.zeros((num, box.n, box.n), np.int8)
  for i in range(min(box.rows, box.cols)):  # box (band i, stack i): no two share a row or column
    perms = np.argsort(rng.random((num, box.n)), axis=1).astype(np.int8) + 1
    seed[:, i * box.rows:(i + 1) * box.rows, i * box.cols:(i + 1) * box.cols] = perms.reshape(num, box.rows, box.cols)
  seed = seed.reshape(num, -1)
  result = solve(seed, box, cap=1, rng=rng)
  stuck = np.flatnonzero(result.count == 0)  # small grids: diagonal boxes may not extend
  if stuck.size:
    first = np.where(np.isin(np.arange(box.cells), box.units[2 * box.n]), seed[stuck], 0)
    result.solutions[stuck] = solve(first, box, cap=1, rng=rng).solutions
  return result.solutions[:, 0]


def _repair(solutions: np.ndarray, mask: np.ndarray, box: Box, rng: np.random.Generator) -> np.ndarray:
  """Reveal cells until every puzzle `where(mask, solutions, 0)` has exactly one solution."""
  todo = np.arange(len(solutions))
  while todo.size:
    res = solve(np.where(mask[todo], solutions[todo], 0), box, cap=2)
    if (res.count == 0).any():
      raise RuntimeError("generator bug: a puzzle lost its own solution")
    multi = res.count >= 2
    rows = todo[multi]
    differ = res.solutions[multi, 0] != res.solutions[multi, 1]  # [R, C]
    pick = np.argmax(differ * rng.random(differ.shape), axis=1)
    mask[rows, pick] = True
    todo = rows
  return mask


def _minimize(solutions: np.ndarray, mask: np.ndarray, box: Box, rng: np.random.Generator) -> np.ndarray:
  """Try removing each clue once (random order per puzzle); keep removals that stay unique."""
  order = np.argsort(rng.random(mask.shape) + ~mask, axis=1)  # each puzzle's clues first, shuffled
  clues = mask.sum(axis=1)
  for k in range(int(clues.max(initial=0))):
    rows = np.flatnonzero(clues > k)
    cell = order[rows, k]
    trial = mask[rows].copy()
    trial[np.arange(rows.size), cell] = False
    res = solve(np.where(trial, solutions[rows], 0), box, cap=2)
    keep = res.count == 1
    mask[rows[keep], cell[keep]] = False
  return mask


def _batch(num: int, box: Box, clues: int, minimize: bool, rng: np.random.Generator) -> Puzzles:
  sols = random_grids(num, box, rng)
  rank = np.argsort(np.argsort(rng.random(sols.shape), axis=1), axis=1)
  mask = _repair(sols, rank < clues, box, rng)
  if minimize:
    mask = _minimize(sols, mask, box, rng)
  inputs = np.where(mask, sols, 0).astype(np.int8)
  ratings = solve(inputs, box, cap=2).guesses
  return Puzzles(inputs, sols, ratings)


def generate(num: int, box: "Box | str" = "3x3", *, seed: "int | tuple[int, ...]" = 0, clues: int | None = None,
             min_rating: int = 0, minimize: bool = False, max_rounds: int = 50) -> Puzzles:
  """`num` distinct puzzles with unique solutions; same arguments -> same puzzles."""
  box = Box.parse(box)
  if num < 0:
    raise ValueError(f"num must be >= 0, got {num}")
  clues = DEFAULT_CLUES.get(box.n, box.cells // 3) if clues is None else clues
  if not 0 <= clues <= box.cells:
    raise ValueError(f"clues must be in [0, {box.cells}] for a {box} box, got {clues}")
  rng = np.random.default_rng(seed)
  empty = np.zeros((0, box.cells), np.int8)
  kept: list[Puzzles] = [Puzzles(empty, empty, np.zeros(0, np.int32))]
  seen: set[bytes] = set()
  have, made = 0, 0
  for _ in range(max_rounds):
    if have >= num:
      break
    want = num - have
    rate = have / made if made else 1.0  # share of generated puzzles kept so far
    ask = min(20 * want, int(np.ceil(want / max(rate, 0.05) * (1.0 if not made else 1.2))) + 8 * bool(made))
    batch = _batch(max(ask, 1), box, clues, minimize, rng)
    made += len(batch)
    idx = []
    for i in np.flatnonzero(batch.ratings >= min_rating):
      key = batch.inputs[i].tobytes()
      if key not in seen and len(idx) < want:
        seen.add(key)
        idx.append(i)
    kept.append(batch.take(np.asarray(idx, np.intp)))
    have += len(idx)
  if have < num:
    raise RuntimeError(
        f"generated only {have} of {num} distinct {box} puzzles with rating >= {min_rating} in {max_rounds} rounds; "
        "lower min_rating, raise clues' range or ask for fewer puzzles")
  return Puzzles.concat(kept)
