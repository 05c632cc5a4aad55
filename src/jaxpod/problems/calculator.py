"""The `calculator` problem set and its environment: multi-turn episodes in which the policy may call a tool.

    jaxpod rl --problems.type calculator                 # the embedded configs/rl_calculator.yaml
    problems: {type: calculator, digits: 4, max_turns: 3, teacher_skip_tool: 0.6}

Problem i of a stream is a product of two `digits`-digit numbers ("Compute 4821*7395.\\n" ->
"35651295"), too long for a small policy to multiply alone. Each problem is an episode with the
`environment` (default: the built-in `calculator`, `Calculator` below): a turn that starts with `calc:` is a tool call
answered with `= <value>`; any other turn is the final answer, reward 1 if it is the product. The
warm-up shows whole episodes, `calc: a*b`, EOS, the tool's `= value`, the answer, EOS, with the
loss on the policy's turns only. Its teacher has a habit (`teacher_skip_tool`): with that probability
it writes a guessed, wrong, answer at once instead of calling the tool; RL unlearns the habit.
"""
from __future__ import annotations

import dataclasses
import re

import numpy as np

from jaxpod.problems.base import Problem, ProblemSet
from jaxpod.problems.environments import environment_factory, register_environment

_FACTORS = re.compile(r"(\d+)\*(\d+)")


@ProblemSet.register_subclass("calculator")
@dataclasses.dataclass(frozen=True)
class CalculatorProblems(ProblemSet):
  """Products of two `digits`-digit numbers, solved in episodes with a calculator tool (see the module docstring)."""

  digits: int = 4  # digits of each factor
  max_turns: int = 3  # policy turns per episode at most (a tool call and the answer need 2)
  environment_name: str = "calculator"  # what episodes talk to: a registered environment or "module:Class"
  teacher_skip_tool: float = 0.0  # warm-up demonstrations guess the answer without the tool with this probability

  TOOL_CALL = "calc: {a}*{b}"  # how the warm-up's teacher calls the tool (not a field)

  def __post_init__(self):
    super().__post_init__()
    if not 1 <= self.digits <= 9:
      raise ValueError(f"rl.problems.digits={self.digits} must be in 1..9")
    if self.max_turns < 1:
      raise ValueError(f"rl.problems.max_turns={self.max_turns} must be >= 1")
    if not 0.0 <= self.teacher_skip_tool <= 1.0:
      raise ValueError(f"rl.problems.teacher_skip_tool={self.teacher_skip_tool} must be in [0, 1]")

  def make(self, rng):
    return calculator_problem(rng, self.digits)

  def environment(self):
    return environment_factory(self.environment_name)

  def demonstration_turns(self, problem: Problem) -> list[str]:
    """`calc: a*b` then the product; with probability teacher_skip_tool a wrong guess of the same length at once."""
    rng = np.random.default_rng([problem.stream, problem.index, 13])  # not the period's draws (7)
    answer = self.demonstration(problem)  # the product, with the base class's teacher_period habit
    if rng.random() >= self.teacher_skip_tool:
      a, b = _FACTORS.search(problem.prompt).groups()
      return [self.TOOL_CALL.format(a=a, b=b), answer]
    n = len(problem.answer)
    guess = problem.answer
    while guess == problem.answer:
      guess = str(int(rng.integers(10 ** (n - 1), 10 ** n)))
    return [guess]

  def well_formed(self, completion: str) -> bool:
    return completion.isdigit() and len(completion) <= 2 * self.digits

  def max_prompt_chars(self) -> int:
    return len("Compute *.\n") + 2 * self.digits

  def max_answer_chars(self) -> int:
    return len(self.TOOL_CALL.format(a="", b="")) + 2 * self.digits


# ----------------------------------------------------------------------------- the environment
_EXPRESSION = re.compile(r"^\s*(\d{1,12})\s*([+\-*])\s*(\d{1,12})\s*$")
CALL = "calc:"


def calculate(expression: str) -> int | None:
  """The value of `a op b` (non-negative integers, op one of + - *), or None if it is not that form.

  A two-operand grammar on purpose: no `eval` of text a policy wrote."""
  m = _EXPRESSION.match(expression)
  if not m:
    return None
  a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
  return a + b if op == "+" else a - b if op == "-" else a * b


@register_environment("calculator")
class Calculator:
  """Answer `problem.answer`; a turn starting with `calc:` is a tool call answered with `= <value>`."""

  def __init__(self):
    self.problem: Problem | None = None

  def reset(self, problem: Problem) -> str:
    self.problem = problem
    return problem.prompt

  def step(self, completion: str) -> tuple[str, float, bool]:
    text = completion.strip()
    if text.startswith(CALL):
      value = calculate(text[len(CALL):])
      return ("= error\n" if value is None else f"= {value}\n"), 0.0, False
    return "", float(text == self.problem.answer), True


def calculator_problem(rng: np.random.Generator, digits: int = 4) -> tuple[str, str]:
  """(prompt, answer) of a product of two `digits`-digit numbers."""
  lo, hi = 10 ** (digits - 1), 10 ** digits
  a, b = int(rng.integers(lo, hi)), int(rng.integers(lo, hi))
  return f"Compute {a}*{b}.\n", str(a * b)
