"""The reference Sudoku augmentation, generalised to any box shape, vectorised.

One augmentation is: relabel the digits by a random permutation (blank stays blank);
transpose with probability 1/2; shuffle the bands and the rows inside each band; shuffle the
stacks and the columns inside each stack. For 3x3 boxes this is exactly the reference's.

Rectangular boxes (r != c, e.g. 2x3): transposing turns a grid of r x c boxes into a grid
of c x r boxes, which is a different puzzle family (a 6x6 grid with 3x2 boxes is not a valid
2x3 Sudoku), so the transpose is only drawn when the box is square; all other moves keep
rows, columns and boxes intact for any shape. With box r x c there are c bands of r rows
and r stacks of c columns.
"""
from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np

from jaxpod.data.sudoku.grid import Box


def _perms(rng: np.random.Generator, m: int, k: int) -> np.ndarray:
  """int [m, k]: m independent random permutations of range(k)."""
  return np.argsort(rng.random((m, k)), axis=1)


def _line_perm(rng: np.random.Generator, m: int, groups: int, size: int) -> np.ndarray:
  """int [m, groups*size]: shuffle the groups, then the lines inside each group."""
  outer = _perms(rng, m, groups)  # [m, groups]
  inner = np.stack([_perms(rng, m, size) for _ in range(groups)], axis=1)  # [m, groups, size]
  return (outer[:, :, None] * size + inner).reshape(m, groups * size)


@dataclasses.dataclass
class Transforms:
  """m symmetry transforms: new[r, c] = digit_map[T(old)[rows[r], cols[c]]], T = transpose or identity."""

  digit_map: np.ndarray  # int [m, n+1], digit_map[:, 0] == 0 (blank stays blank)
  rows: np.ndarray  # int [m, n]: source row of each target row (bands, then rows in band)
  cols: np.ndarray  # int [m, n]: source column of each target column (stacks, then columns in stack)
  transposed: np.ndarray  # bool [m]: transpose first (square boxes only)

  def apply(self, boards: np.ndarray) -> np.ndarray:
    """boards int [m, n*n] (one per transform) -> transformed boards, same dtype."""
    m, n = self.rows.shape
    row = np.arange(m)[:, None]
    b = np.asarray(boards).reshape(m, n, n)
    b = np.where(self.transposed[:, None, None], b.transpose(0, 2, 1), b)
    b = b[row, self.rows]  # [m, n, n] rows moved
    b = b.transpose(0, 2, 1)[row, self.cols].transpose(0, 2, 1)  # columns moved
    return self.digit_map.astype(boards.dtype)[row, b.reshape(m, n * n)]


def random_transforms(m: int, box: "Box | str", rng: np.random.Generator) -> Transforms:
  """m random transforms drawn as the reference does (transpose only for square boxes)."""
  box = Box.parse(box)
  digit_map = np.concatenate([np.zeros((m, 1), np.intp), _perms(rng, m, box.n) + 1], axis=1)
  transposed = rng.random(m) < 0.5 if box.rows == box.cols else np.zeros(m, bool)
  rows = _line_perm(rng, m, box.cols, box.rows)  # c bands of r rows
  cols = _line_perm(rng, m, box.rows, box.cols)  # r stacks of c columns
  return Transforms(digit_map=digit_map, rows=rows, cols=cols, transposed=transposed)


def augment(inputs: np.ndarray, labels: np.ndarray, box: "Box | str",
            rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
  """One random augmentation per row of (inputs, labels), the same transform for both."""
  t = random_transforms(len(inputs), box, rng)
  return t.apply(inputs), t.apply(labels)


def _all_line_perms(groups: int, size: int) -> np.ndarray:
  """int [groups! * size!^groups, groups*size]: every band/row (or stack/column) shuffle."""
  outer = np.array(list(itertools.permutations(range(groups))))
  inner = np.array(list(itertools.permutations(range(size))))
  out = []
  for o in outer:
    for combo in itertools.product(range(len(inner)), repeat=groups):
      out.append(np.concatenate([o[g] * size + inner[combo[g]] for g in range(groups)]))
  return np.array(out)


def group_size(box: "Box | str") -> int:
  """Number of board moves (row, column and transpose moves; digit relabelling not counted)."""
  box = Box.parse(box)
  f = math.factorial
  rows = f(box.cols) * f(box.rows) ** box.cols
  cols = f(box.rows) * f(box.cols) ** box.rows
  return rows * cols * (2 if box.rows == box.cols else 1)


def _exact_keys(boards: np.ndarray, box: Box, chunk: int = 16) -> list[bytes]:
  """Canonical form of each board: the smallest image over every move and digit relabelling."""
  n = box.n
  rows, cols = _all_line_perms(box.cols, box.rows), _all_line_perms(box.rows, box.cols)
  i = np.arange(n * n)
  src = (rows[:, None, i // n] * n + cols[None, :, i % n]).reshape(-1, n * n)  # [G, C]
  if box.rows == box.cols:
    src = np.concatenate([src, (src % n) * n + src // n])
  keys = []
  for start in range(0, len(boards), chunk):
    moved = boards[start:start + chunk][:, src]  # [p, G, C]
    onehot = moved[..., None] == np.arange(1, n + 1)  # [p, G, C, n]
    first = np.where(onehot.any(2), onehot.argmax(2), n * n)  # [p, G, n] first cell of each digit
    label = np.argsort(np.argsort(first, axis=-1), axis=-1) + 1  # digits renamed by first appearance
    relabelled = np.where(moved > 0, np.take_along_axis(label, np.maximum(moved - 1, 0).astype(np.intp), -1), 0)
    for forms in relabelled.astype(np.uint8):
      keys.append(forms[np.lexsort(forms.T[::-1])[0]].tobytes())
  return keys


def _invariant_keys(boards: np.ndarray, box: Box) -> list[bytes]:
  """A move- and relabelling-invariant signature: multiset over clues of (row, column, box clue
  counts, frequency of the clue's digit); row and column counts are unordered when the box is square."""
  clue = boards > 0
  u = clue[:, box.units].sum(-1)  # [B, 3n] clue count per unit
  cu = box.cell_units
  rc, cc, bc = u[:, cu[:, 0]], u[:, cu[:, 1]], u[:, cu[:, 2]]
  if box.rows == box.cols:
    rc, cc = np.minimum(rc, cc), np.maximum(rc, cc)
  freq = (boards[:, :, None] == np.arange(1, box.n + 1)).sum(1)  # [B, n]
  df = np.take_along_axis(freq, np.maximum(boards - 1, 0).astype(np.intp), 1)
  sig = ((rc * 32 + cc) * 32 + bc) * 32 + df
  sig = np.sort(np.where(clue, sig, -1), axis=1)
  return [s.astype(np.int32).tobytes() for s in sig]


def class_keys(boards: np.ndarray, box: "Box | str", exact_limit: int = 500) -> list[bytes]:
  """Equal keys for boards that are augmentations of each other; exact for small groups
  (4x4), otherwise a conservative invariant (equal key = maybe the same class)."""
  box = Box.parse(box)
  boards = np.asarray(boards).reshape(-1, box.cells)
  if group_size(box) <= exact_limit:
    return _exact_keys(boards, box)
  return _invariant_keys(boards, box)
