"""Generator: every puzzle has exactly one solution (checked by an independent brute-force solver)."""
from __future__ import annotations

import numpy as np
import pytest

from jaxpod.data.sudoku import Box, generate, solve
from tests.data.brute import count_solutions, grid_ok


@pytest.mark.parametrize("box,num", [("2x2", 60), ("2x3", 25)])
def test_puzzles_unique_by_brute_force(box, num):
  """Uniqueness is what makes the label well defined: brute force agrees on every puzzle."""
  b = Box.parse(box)
  p = generate(num, box, seed=3)
  assert p.inputs.shape == (num, b.cells) and p.ratings.shape == (num,)
  assert len({x.tobytes() for x in p.inputs}) == num  # distinct
  for q, s in zip(p.inputs, p.solutions):
    assert grid_ok(s, b.rows, b.cols)
    count, sol = count_solutions(q, b.rows, b.cols)
    assert count == 1 and sol == s.tolist()


@pytest.mark.parametrize("box", ["2x2", "2x3"])
def test_solver_counts_match_brute_force(box):
  """The fast solver's capped count equals brute force on random (often ambiguous or impossible) boards."""
  b = Box.parse(box)
  rng = np.random.default_rng(0)
  grids = generate(30, box, seed=1).solutions
  boards = np.where(rng.random(grids.shape) < 0.3, grids, 0)
  # some impossible boards too: overwrite one clue with a wrong digit
  wrong = boards[:8].copy()
  idx = np.argmax(wrong > 0, axis=1)
  wrong[np.arange(8), idx] = wrong[np.arange(8), idx] % b.n + 1
  boards = np.concatenate([boards, wrong])
  res = solve(boards, b, cap=2)
  for board, count, sols in zip(boards, res.count, res.solutions):
    want, _ = count_solutions(board, b.rows, b.cols)
    assert count == want
    for s in sols[:count]:
      assert grid_ok(s, b.rows, b.cols) and ((board == 0) | (board == s)).all()


def test_deterministic_by_seed_and_9x9():
  """Same seed, same puzzles (every host can rebuild the same dataset); 9x9 puzzles are unique."""
  a = generate(20, "3x3", seed=5)
  b = generate(20, "3x3", seed=5)
  c = generate(20, "3x3", seed=6)
  assert (a.inputs == b.inputs).all() and (a.ratings == b.ratings).all()
  assert not (a.inputs == c.inputs).all()
  res = solve(a.inputs, "3x3", cap=2)
  assert (res.count == 1).all() and (res.solutions[:, 0] == a.solutions).all()
  assert all(grid_ok(s, 3, 3) for s in a.solutions)
  assert (res.guesses == a.ratings).all()


def test_difficulty_knobs():
  """Fewer clues -> fewer givens; minimize -> removing any clue breaks uniqueness; min_rating filters."""
  easy = generate(30, "2x3", seed=0, clues=20)
  hard = generate(30, "2x3", seed=0, clues=6)
  assert (easy.inputs > 0).sum(1).mean() > (hard.inputs > 0).sum(1).mean()
  minimal = generate(10, "2x2", seed=0, minimize=True)
  for q in minimal.inputs:
    for cell in np.flatnonzero(q):
      fewer = q.copy()
      fewer[cell] = 0
      assert count_solutions(fewer, 2, 2)[0] == 2
  rated = generate(5, "3x3", seed=0, clues=22, minimize=True, min_rating=1)
  assert (rated.ratings >= 1).all()


def test_bad_arguments():
  with pytest.raises(ValueError, match="clues"):
    generate(1, "2x2", clues=17)
  with pytest.raises(ValueError, match="box"):
    generate(1, "3y3")
