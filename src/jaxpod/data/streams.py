"""Seeded problem streams: problem i of stream s is a pure function of (seed, s, i), so any host or worker
rebuilds any problem from three integers (nothing but indices crosses the control plane).

    held = held_out(lambda i: make(seed, HELD_OUT_STREAM, i), count=256, prompt=lambda p: p[0])
    train = training(lambda i: make(seed, 1, i), {prompt(p) for p in held}, start=0, count=32, prompt=...)

Stream HELD_OUT_STREAM holds the held-out problems (its first `count` distinct prompts); training streams
(1, 2, ...) skip every problem whose prompt is held out, so held-out accuracy is measured on prompts the
policy never trained on. Both `jaxpod.problems` (RL's problem sets) and `sort_digits` (the preference
default) walk their streams with these two functions.
"""
from __future__ import annotations

from typing import Callable, TypeVar

P = TypeVar("P")
HELD_OUT_STREAM = 0  # stream of the held-out problems; training streams are 1, 2, ...
TRIES_PER_PROBLEM = 100  # held_out gives up after this many draws per problem asked for


def held_out(problem: Callable[[int], P], count: int, prompt: Callable[[P], str]) -> list[P]:
  """The first `count` problems of distinct prompts among `problem(0), problem(1), ...` (fewer if the stream has
  fewer distinct prompts than that within TRIES_PER_PROBLEM * count draws)."""
  seen, out, i = set(), [], 0
  while len(out) < count and i <= TRIES_PER_PROBLEM * count:
    p = problem(i)
    if prompt(p) not in seen:
      seen.add(prompt(p))
      out.append(p)
    i += 1
  return out


def training(problem: Callable[[int], P], skip: set[str], start: int, count: int,
             prompt: Callable[[P], str]) -> list[tuple[int, P]]:
  """`count` (index, problem) from index `start` of a training stream, problems whose prompt is in `skip` left out."""
  out, i = [], start
  while len(out) < count:
    p = problem(i)
    if prompt(p) not in skip:
      out.append((i, p))
    i += 1
  return out
