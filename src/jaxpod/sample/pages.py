"""`PagePool`: the host-side book of KV pages: a free list and a reference count per page.

Page 0 is the scratch page (never handed out): unused page-table entries point at it. A
prompt's full pages are shared by its n samples (one reference each); a page returns to
the free list when its last reference is dropped.
"""
from __future__ import annotations


class PagePool:
  """Free list + reference counts over pages 1..num_pages-1."""

  def __init__(self, num_pages: int):
    self.num_pages = num_pages
    self._free = list(range(num_pages - 1, 0, -1))  # pop() hands out low page ids first
    self._refs = [0] * num_pages
    self.peak_used = 0  # most pages held at once

  @property
  def free(self) -> int:
    return len(self._free)

  @property
  def used(self) -> int:
    return self.num_pages - 1 - len(self._free)

  def alloc(self, count: int) -> list[int]:
    """`count` fresh pages with one reference each; raises if fewer are free (callers check `free`)."""
    if count > len(self._free):
      raise RuntimeError(f"page pool: {count} pages asked, {len(self._free)} free")
    got = [self._free.pop() for _ in range(count)]
    for p in got:
      self._refs[p] = 1
    self.peak_used = max(self.peak_used, self.used)
    return got

  def share(self, pages: list[int]) -> list[int]:
    """One more reference to each page (a sample sharing its prompt's full pages)."""
    for p in pages:
      self._refs[p] += 1
    return list(pages)

  def release(self, pages: list[int]) -> None:
    """Drop one reference to each page; pages nobody holds go back to the free list."""
    for p in pages:
      self._refs[p] -= 1
      if self._refs[p] == 0:
        self._free.append(p)
      elif self._refs[p] < 0:
        raise RuntimeError(f"page pool: page {p} released more often than taken")
