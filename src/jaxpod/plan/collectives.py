"""Collectives of a compiled program, read from its HLO text (`compiled.as_text()`), by kind.

    found = collectives(compiled.as_text())
    found["all-gather"]     # Collective(ops=3, executed=66, bytes=...): per device, each loop body times its trips

Per op the bytes are its result buffer on one device (an all-gather's gathered array, a reduce-scatter's shard,
an all-reduce's array); an async pair (`*-start` / `*-done`) counts once, at its start. An op inside a while
loop (a scanned layer stack, gradient accumulation) counts once per trip: the trip count is read from the loop's
condition (`compare(counter, constant(N)), direction=LT`, what `lax.scan` lowers to); a loop whose bound is not
a constant counts once (then `exact` is False).
"""
from __future__ import annotations

import dataclasses
import re

KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
_ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
             "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_ARRAY = re.compile(r"\b([a-z]+\d*)\[([\d,]*)\]")
_HEADER = re.compile(r"^(ENTRY )?%?([\w.\-]+) \(")
_OP = re.compile(r"^\s*(?:ROOT )?%?[\w.\-]+ = ")
_WHILE = re.compile(r"condition=%?([\w.\-]+), body=%?([\w.\-]+)")
_CALLS = re.compile(r"(?:calls|to_apply|true_computation|false_computation)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_BOUND = re.compile(r"constant\((\d+)\)")


@dataclasses.dataclass
class Collective:
  """One kind's collectives in a program, per device."""

  ops: int = 0  # in the program text
  executed: int = 0  # run per step (loop bodies times their trips)
  bytes: int = 0  # result bytes moved per step, per device


def _type_and_opcode(rest: str) -> tuple[str, str]:
  """(result type, opcode) of the text after `name = `: a tuple type is balanced parentheses."""
  if rest.startswith("("):
    depth = 0
    for i, ch in enumerate(rest):
      depth += ch == "("
      depth -= ch == ")"
      if depth == 0:
        break
    typ, tail = rest[:i + 1], rest[i + 1:]
  else:
    typ, _, tail = rest.partition(" ")
  return typ, tail.strip().split("(", 1)[0].strip()


def _largest_array(typ: str) -> int:
  sizes = [_ITEMSIZE.get(dt, 4) * _prod(dims) for dt, dims in _ARRAY.findall(typ) if dt in _ITEMSIZE]
  return max(sizes, default=0)


def _prod(dims: str) -> int:
  out = 1
  for d in filter(None, dims.split(",")):
    out *= int(d)
  return out


def _computations(text: str) -> tuple[dict[str, list[str]], str]:
  """Lines of each computation by name, and the entry computation's name."""
  comps: dict[str, list[str]] = {}
  entry, current = "", None
  for line in text.splitlines():
    m = _HEADER.match(line)
    if m and line.rstrip().endswith("{"):
      current = m.group(2)
      comps[current] = []
      entry = current if m.group(1) else entry
    elif current is not None and line.strip() != "}":
      comps[current].append(line)
  return comps, entry


def _trips(lines: list[str]) -> int | None:
  """The bound N of a loop condition `i < N` (None: not a constant)."""
  if not any("direction=LT" in line for line in lines):
    return None
  bounds = [int(b) for line in lines for b in _BOUND.findall(line) if " s32[]" in line or "s32[]{" in line]
  return max(bounds) if bounds else None


def collectives(text: str) -> tuple[dict[str, Collective], bool]:
  """({kind: Collective} for every kind in KINDS, exact): see the module docstring."""
  comps, entry = _computations(text)
  calls: dict[str, list[tuple[str, int]]] = {name: [] for name in comps}  # caller -> (callee, times per call)
  exact = True
  for name, lines in comps.items():
    for line in lines:
      w = _WHILE.search(line)
      if w:
        n = _trips(comps.get(w.group(1), []))
        exact &= n is not None
        calls[name] += [(w.group(1), (n or 1) + 1), (w.group(2), n or 1)]
      calls[name] += [(c, 1) for c in _CALLS.findall(line)]
      for b in _BRANCHES.findall(line):
        calls[name] += [(c.strip().lstrip("%"), 1) for c in b.split(",")]
  runs: dict[str, int] = {}

  def visit(name: str, times: int) -> None:
    runs[name] = runs.get(name, 0) + times
    for callee, k in calls.get(name, []):
      visit(callee, times * k)

  visit(entry, 1)
  found = {kind: Collective() for kind in KINDS}
  for name, lines in comps.items():
    for line in lines:
      m = _OP.match(line)
      if not m:
        continue
      typ, opcode = _type_and_opcode(line[m.end():])
      kind = opcode[:-len("-start")] if opcode.endswith("-start") else opcode
      if kind in found:
        c, n = found[kind], runs.get(name, 0)
        c.ops, c.executed, c.bytes = c.ops + 1, c.executed + n, c.bytes + n * _largest_array(typ)
  return found, exact


_KERNEL = re.compile(r"^\s*(?:ROOT )?%?([A-Za-z_][\w\-]*?)(?:\.\d+)? = .*custom_call_target=\"tpu_custom_call\"")


def kernels(hlo: str) -> dict[str, int]:
  """Mosaic (Pallas TPU) kernels in the program text by name (`splash_mha_fwd_...`: 2), ops as written."""
  found: dict[str, int] = {}
  for line in hlo.splitlines():
    m = _KERNEL.match(line)
    if m:
      found[m.group(1)] = found.get(m.group(1), 0) + 1
  return dict(sorted(found.items()))
