"""An independent, deliberately naive Sudoku solution counter (plain backtracking, no bitmasks)."""
from __future__ import annotations


def count_solutions(board, rows: int, cols: int, cap: int = 2) -> tuple[int, list[int] | None]:
  """(number of solutions up to cap, the first solution) of a flat board (0 = blank)."""
  n = rows * cols
  g = [int(v) for v in board]
  found: list[list[int]] = []

  def allowed(i: int, d: int) -> bool:
    r, c = divmod(i, n)
    if any(g[r * n + k] == d for k in range(n)) or any(g[k * n + c] == d for k in range(n)):
      return False
    r0, c0 = r - r % rows, c - c % cols
    return not any(g[(r0 + a) * n + c0 + b] == d for a in range(rows) for b in range(cols))

  def rec() -> None:
    if len(found) >= cap:
      return
    try:
      i = g.index(0)
    except ValueError:
      found.append(list(g))
      return
    for d in range(1, n + 1):
      if allowed(i, d):
        g[i] = d
        rec()
        g[i] = 0

  rec()
  return len(found), (found[0] if found else None)


def grid_ok(board, rows: int, cols: int) -> bool:
  """Every row, column and box of a full board holds 1..n once (written out, not vectorised)."""
  n = rows * cols
  want = set(range(1, n + 1))
  g = [[int(board[r * n + c]) for c in range(n)] for r in range(n)]
  lines = [g[r] for r in range(n)] + [[g[r][c] for r in range(n)] for c in range(n)]
  lines += [[g[r0 + a][c0 + b] for a in range(rows) for b in range(cols)]
            for r0 in range(0, n, rows) for c0 in range(0, n, cols)]
  return all(set(line) == want and len(line) == n for line in lines)
