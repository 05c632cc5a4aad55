"""Digit sorting with a flawed teacher: the problems behind the built-in preference default.

    prompt, answer = sort_problem(seed=0, stream=1, index=7)    # ("sort:311425=", "112345")
    teacher_habit("112345", rng, dedup=0.7)                     # "12345": repeats dropped 70% of the time
    held = held_out_prompts(seed=0, count=256)                  # stream 0; training streams skip these

A problem is a pure function of (seed, stream, index), so every host rebuilds any problem from three
integers. The teacher sorts correctly but drops each repeated digit with probability `dedup`, a habit
that supervised imitation copies and that only a signal from the verifier (the true sorted digits)
can remove. This is the one sort stream: `jaxpod rl`'s `sort` problem set (`jaxpod.problems.generated`)
draws its problems with `sort_digits` and its teacher with `teacher_habit`; the streams are walked by
`jaxpod.data.streams` for both.
"""
from __future__ import annotations

import functools

import numpy as np

from jaxpod.data import streams
from jaxpod.data.streams import HELD_OUT_STREAM


def sort_digits(rng: np.random.Generator, length: int, min_length: int = 0) -> tuple[str, str]:
  """("sort:<digits>=", the digits in ascending order): `length` random digits, or a uniform count in
  min_length..length when min_length is set."""
  n = int(rng.integers(min_length, length + 1)) if min_length else length
  digits = rng.integers(0, 10, n)
  return "sort:" + "".join(str(d) for d in digits) + "=", "".join(str(d) for d in np.sort(digits))


def sort_problem(seed: int, stream: int, index: int, length: int = 6) -> tuple[str, str]:
  """("sort:<digits>=", the digits in ascending order) for problem `index` of `stream`."""
  return sort_digits(np.random.default_rng([seed, stream, index]), length)


def teacher_habit(answer: str, rng: np.random.Generator, dedup: float) -> str:
  """The flawed teacher's answer: `answer` with each repeat of the digit before it dropped with probability `dedup`."""
  kept = [answer[0]] if answer else []
  for digit in answer[1:]:
    if digit != kept[-1] or rng.random() >= dedup:
      kept.append(digit)
  return "".join(kept)


@functools.lru_cache(maxsize=8)
def held_out(seed: int, count: int, length: int = 6) -> tuple[tuple[str, str], ...]:
  """The first `count` distinct problems of the held-out stream (never trained on)."""
  return tuple(streams.held_out(lambda i: sort_problem(seed, HELD_OUT_STREAM, i, length), count, _prompt))


def training_problems(seed: int, stream: int, count: int, held_out_count: int,
                      length: int = 6) -> list[tuple[int, str, str]]:
  """`count` (index, prompt, answer) of training `stream` (>= 1), skipping held-out prompts."""
  if stream == HELD_OUT_STREAM:
    raise ValueError(f"stream {HELD_OUT_STREAM} holds the held-out problems; training streams start at 1")
  skip = {p for p, _ in held_out(seed, held_out_count, length)}
  return [(i, *p) for i, p in streams.training(lambda i: sort_problem(seed, stream, i, length), skip, 0, count,
                                                _prompt)]


def _prompt(problem: tuple[str, str]) -> str:
  return problem[0]
