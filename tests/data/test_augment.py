"""Augmentation: every augmented board is a valid Sudoku of the same box shape, consistent with its puzzle."""
from __future__ import annotations

import numpy as np
import pytest

from jaxpod.data.sudoku import Box, agrees, augment, class_keys, generate, random_transforms
from jaxpod.data.sudoku.augment import group_size
from tests.data.brute import count_solutions, grid_ok


@pytest.mark.parametrize("box", ["2x2", "2x3", "3x2", "3x3"])
def test_augmented_boards_valid(box):
  """Rows, columns and boxes stay permutations of 1..n; clues stay consistent with the solution."""
  b = Box.parse(box)
  p = generate(12, box, seed=0)
  rng = np.random.default_rng(0)
  for _ in range(4):
    inputs, labels = augment(p.inputs, p.solutions, box, rng)
    assert all(grid_ok(s, b.rows, b.cols) for s in labels)
    assert agrees(inputs, labels).all()
    assert ((inputs > 0).sum(1) == (p.inputs > 0).sum(1)).all()  # same number of clues
    assert (np.sort(inputs, 1) != np.sort(p.inputs, 1)).any() or box == "2x2"  # digits really move


def test_augmented_puzzle_keeps_its_unique_solution():
  """A moved puzzle's one solution is the moved solution (brute force)."""
  p = generate(10, "2x3", seed=2)
  inputs, labels = augment(p.inputs, p.solutions, "2x3", np.random.default_rng(1))
  for q, s in zip(inputs, labels):
    count, sol = count_solutions(q, 2, 3)
    assert count == 1 and sol == s.tolist()


def test_transpose_only_for_square_boxes():
  """Transposing a 2x3-box grid gives 3x2 boxes, not a valid 2x3 Sudoku, so it is never drawn."""
  rng = np.random.default_rng(0)
  assert not random_transforms(200, "2x3", rng).transposed.any()
  t = random_transforms(200, "3x3", rng).transposed
  assert 50 < t.sum() < 150  # probability 1/2 as the reference
  grid = generate(1, "2x3", seed=0).solutions[0].reshape(6, 6)
  assert not grid_ok(grid.T.ravel(), 2, 3)


@pytest.mark.parametrize("box", ["2x2", "2x3", "3x3"])
def test_class_keys_see_through_augmentation(box):
  """An augmentation of a puzzle has the same class key (used to keep test puzzles out of train)."""
  p = generate(20, box, seed=4)
  moved, _ = augment(p.inputs, p.solutions, box, np.random.default_rng(3))
  assert class_keys(p.inputs, box) == class_keys(moved, box)
  assert group_size("2x2") == 128 and group_size("3x3") == 2 * 6**8
