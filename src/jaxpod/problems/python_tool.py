"""The `python` environment (the policy's programs run in a sandbox) and the `python` problem set that needs it.

    jaxpod rl --problems.type python                     # the embedded configs/rl_python.yaml
    problems: {type: python, digits: 4, max_turns: 3, teacher_skip_tool: 0.6, timeout_s: 2.0, memory_mb: 256}

`PythonTool` (registered as `python`): a turn that is a whole number is the final answer (reward 1 if it is
the problem's); any other turn is a Python program, run by `jaxpod.problems.sandbox.run_python` (no network,
CPU, memory, file and process limits, a fresh scratch directory, killed on timeout), and what it prints is
the observation, with a note when it failed or hit a limit ("ZeroDivisionError: division by zero",
"[timeout after 2.0 s]", "[memory limit: 256 MiB]", "PermissionError: [network disabled]").

A program that is just `print(a op b)` with two integer literals (op one of + - *, what the warm-up's
teacher writes) is answered in-process by `calculator.calculate`, with the output Python would print: the
warm-up replays thousands of teacher episodes and a subprocess costs ~0.1 s; every other program runs in
the sandbox.

The `python` problem set: "Compute 4821*7395.\\n" -> "35651295", as the calculator's, with a teacher that
writes `print(4821*7395)`, reads the output and copies it, or (`teacher_skip_tool`) guesses at once.
"""
from __future__ import annotations

import dataclasses
import functools
import re

from jaxpod.problems.base import ProblemSet
from jaxpod.problems.calculator import Calculator, CalculatorProblems, calculate
from jaxpod.problems.environments import register_environment
from jaxpod.problems.sandbox import SandboxLimits, run_python

_ANSWER = re.compile(r"-?\d+")
_INT = r"(?:0|[1-9]\d{0,11})"  # a decimal literal as Python reads it (012 is a SyntaxError)
_LITERAL_PRINT = re.compile(rf"print\(({_INT} ?[+\-*] ?{_INT})\)")


def observe(program: str, limits: SandboxLimits) -> str:
  """What the policy reads after writing `program`: its output and how it ended (see the module docstring)."""
  m = _LITERAL_PRINT.fullmatch(program)
  if m:
    return f"{calculate(m.group(1))}\n"
  return run_python(program, limits).observation


@register_environment("python")
class PythonTool(Calculator):
  """Answer `problem.answer` (a whole-number turn); any other turn is a program whose output is the observation
  (the calculator's episode, `reset` included, with another tool)."""

  def __init__(self, limits: SandboxLimits | None = None):
    super().__init__()
    self.limits = limits or SandboxLimits()

  def step(self, completion: str) -> tuple[str, float, bool]:
    text = completion.strip()
    if _ANSWER.fullmatch(text):
      return "", float(text == self.problem.answer), True
    return observe(text, self.limits), 0.0, False


@ProblemSet.register_subclass("python")
@dataclasses.dataclass(frozen=True)
class PythonProblems(CalculatorProblems):
  """The calculator's products, solved in episodes with a Python tool (see the module docstring)."""

  environment_name: str = "python"  # what episodes talk to: `python` (this set's sandbox limits) or another
  timeout_s: float = 2.0  # wall-clock seconds a program may run (then its whole process tree is killed)
  cpu_s: int = 2  # CPU seconds a program may use
  memory_mb: int = 256  # address space per process, MiB
  max_output_chars: int = 256  # characters of a program's output in the observation

  TOOL_CALL = "print({a}*{b})"

  def __post_init__(self):
    super().__post_init__()
    try:
      self.limits()
    except ValueError as e:
      raise ValueError(f"rl.problems: {e}") from None

  def limits(self) -> SandboxLimits:
    """The sandbox limits of this set's programs."""
    return SandboxLimits(timeout_s=self.timeout_s, cpu_s=self.cpu_s, memory_mb=self.memory_mb,
                         max_output_chars=self.max_output_chars)

  def environment(self):
    if self.environment_name == "python":
      return functools.partial(PythonTool, self.limits())
    return super().environment()
