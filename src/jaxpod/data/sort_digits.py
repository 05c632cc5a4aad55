"""Digit sorting with a flawed teacher: the problems behind the built-in preference default.

    prompt, answer = sort_problem(seed=0, stream=1, index=7)    # ("sort:311425=", "112345")
    teacher_habit("112345", rng, dedup=0.7)                     # "12345": repeats dropped 70% of the time
    held = held_out_prompts(seed=0, count=256)                  # stream 0; training streams skip these

A problem is a pure function of (seed, stream, index), so every host rebuilds any problem from three
integers. The teacher sorts correctly but drops each repeated digit with probability `dedup`, a habit
that supervised imitation copies and that only a signal from the verifier (the true sorted digits)
can remove. (tasks/ and rl/ sit on one floor and never import each other, so what both use lives
here, a floor below: `jaxpod rl`'s sort task takes its teacher from `teacher_habit`.)
"""
from __future__ import annotations

import functools

import numpy as np

HELD_OUT_STREAM = 0  # stream of the held-out problems; training streams are 1, 2, ...


def sort_problem(seed: int, stream: int, index: int, length: int = 6) -> tuple[str, str]:
  """("sort:<digits>=", the digits in ascending order) for problem `index` of `stream`."""
  digits = np.random.default_rng([seed, stream, index]).integers(0, 10, length)
  return "sort:" + "".join(str(d) for d in digits) + "=", "".join(str(d) for d in np.sort(digits))


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
  seen: dict[str, str] = {}
  index = 0
  while len(seen) < count:
    prompt, answer = sort_problem(seed, HELD_OUT_STREAM, index, length)
    seen.setdefault(prompt, answer)
    index += 1
  return tuple(seen.items())


def training_problems(seed: int, stream: int, count: int, held_out_count: int,
                      length: int = 6) -> list[tuple[int, str, str]]:
  """`count` (index, prompt, answer) of training `stream` (>= 1), skipping held-out prompts."""
  if stream == HELD_OUT_STREAM:
    raise ValueError(f"stream {HELD_OUT_STREAM} holds the held-out problems; training streams start at 1")
  skip = {p for p, _ in held_out(seed, held_out_count, length)}
  out, index = [], 0
  while len(out) < count:
    prompt, answer = sort_problem(seed, stream, index, length)
    if prompt not in skip:
      out.append((index, prompt, answer))
    index += 1
  return out
