"""Generated problem sets: arithmetic and sorting, each problem a pure function of (seed, stream, index).

    jaxpod rl --problems.type addition --problems.digits 3
    problems: {type: sort, length: 6, teacher_dedup: 0.7}

  addition   "a+b=" -> the decimal sum (operands of 1..digits digits)
  sort       "sort:3142=" -> "1234" (the digits in ascending order; `jaxpod.data.sort_digits`, the stream the
             preference default uses too)

Each has a `teacher_*` habit: the warm-up's demonstrations are flawed the same way every time a problem
is shown, so imitation copies the habit and only the verifier's reward can remove it.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from jaxpod.data import sort_digits
from jaxpod.problems.base import Problem, ProblemSet


@ProblemSet.register_subclass("addition")
@dataclasses.dataclass(frozen=True)
class AdditionProblems(ProblemSet):
  """"a+b=" -> a + b in decimal; each operand has 1..digits digits (uniform length, then uniform value).

  `teacher_carry_slip`: the warm-up's teacher forgets each carry with that probability (the exact-match
  reward always checks the true sum)."""

  digits: int = 3  # most digits per operand
  teacher_carry_slip: float = 0.0  # warm-up demonstrations drop each carry with this probability (0: correct)

  def __post_init__(self):
    super().__post_init__()
    if not 1 <= self.digits <= 9:
      raise ValueError(f"rl.problems.digits={self.digits} must be in 1..9")
    if not 0.0 <= self.teacher_carry_slip <= 1.0:
      raise ValueError(f"rl.problems.teacher_carry_slip={self.teacher_carry_slip} must be in [0, 1]")

  def teacher_answer(self, problem: Problem, rng: np.random.Generator) -> str:
    """The sum column by column, each carry dropped with probability teacher_carry_slip."""
    if self.teacher_carry_slip == 0:
      return problem.answer
    from jaxpod.data.word_problems import sum_with_slips
    a, b = (int(x) for x in problem.prompt.rstrip("=").split("+"))
    return str(sum_with_slips(a, b, self.teacher_carry_slip, rng))

  def _operand(self, rng) -> int:
    n = int(rng.integers(1, self.digits + 1))
    return int(rng.integers(0 if n == 1 else 10 ** (n - 1), 10 ** n))

  def make(self, rng):
    a, b = self._operand(rng), self._operand(rng)
    return f"{a}+{b}=", str(a + b)

  def well_formed(self, completion: str) -> bool:
    return completion.isdigit() and len(completion) <= self.digits + 1

  def max_prompt_chars(self) -> int:
    return 2 * self.digits + 2

  def max_answer_chars(self) -> int:
    return self.digits + 2  # the sum's digits and a teacher's period


@ProblemSet.register_subclass("sort")
@dataclasses.dataclass(frozen=True)
class SortProblems(ProblemSet):
  """"sort:3142=" -> "1234": `length` random digits in ascending order."""

  length: int = 6  # digits per problem (the most, with min_length)
  min_length: int = 0  # fewest digits per problem (0: always `length`); lengths are uniform in between
  teacher_dedup: float = 0.0  # warm-up demonstrations drop repeated digits with this probability ("1123" -> "123")

  def __post_init__(self):
    super().__post_init__()
    if not 2 <= self.length <= 32:
      raise ValueError(f"rl.problems.length={self.length} must be in 2..32")
    if self.min_length and not 1 <= self.min_length <= self.length:
      raise ValueError(f"rl.problems.min_length={self.min_length} must be in 1..length={self.length} (or 0)")
    if not 0.0 <= self.teacher_dedup <= 1.0:
      raise ValueError(f"rl.problems.teacher_dedup={self.teacher_dedup} must be in [0, 1]")

  def teacher_answer(self, problem: Problem, rng: np.random.Generator) -> str:
    """The sorted digits, each repeat of a digit left out with probability teacher_dedup."""
    return sort_digits.teacher_habit(problem.answer, rng, self.teacher_dedup)

  def make(self, rng):
    return sort_digits.sort_digits(rng, self.length, self.min_length)

  def well_formed(self, completion: str) -> bool:
    return completion.isdigit() and (self.min_length or self.length) <= len(completion) <= self.length

  def max_prompt_chars(self) -> int:
    return self.length + 6

  def max_answer_chars(self) -> int:
    return self.length + 1  # the digits and a teacher's period
