"""`ProblemSet`: a seeded stream of (prompt, answer) problems, one registered config class per kind.

    problems: {type: addition, digits: 3}      # in an RL config (a draccus choice, like `jaxpod train`'s task)

A problem set is a frozen dataclass registered with `@ProblemSet.register_subclass("name")`; it
makes problem i of a stream from `numpy.random.default_rng([seed, stream, i])` alone, so any
host or worker can rebuild any problem from three integers (nothing but indices crosses the
control plane). The held-out set is the first `eval_size` distinct problems of stream
EVAL_STREAM; a training problem whose prompt is in it is drawn again under its index
(`[seed, stream, i, redraw]`), so held-out accuracy is measured on prompts the policy never trained
on and problem i of a stream is one problem, whichever call asks for it.

The built-in sets (`generated`: addition, sort; `calculator`; `dataset`) register when
`jaxpod.problems` is imported; a user's set registers when its module is imported.
"""
from __future__ import annotations

import dataclasses
import functools

import draccus
import numpy as np

from jaxpod.data import streams

EVAL_STREAM = streams.HELD_OUT_STREAM  # stream of the held-out problems; training streams are 1, 2, ...


@dataclasses.dataclass(frozen=True)
class Problem:
  """One prompt with its reference answer."""

  prompt: str  # what the policy is given, e.g. "123+456="
  answer: str  # the exact answer the reward checks, e.g. "579"
  stream: int = 0  # which seeded stream it came from
  index: int = 0  # its position in that stream


@dataclasses.dataclass(frozen=True)
class ProblemSet(draccus.ChoiceRegistry):
  """A seeded stream of problems with exact answers (built in: `addition`, `sort`, `calculator`, `dataset`)."""

  eval_size: int = 256  # held-out problems for accuracy (never trained on)
  teacher_period: float = 0.0  # warm-up demonstrations end with "." with this probability (exact match wants none)

  def __post_init__(self):
    if self.eval_size < 1:
      raise ValueError(f"rl.problems.eval_size={self.eval_size} must be >= 1")
    if not 0.0 <= self.teacher_period <= 1.0:
      raise ValueError(f"rl.problems.teacher_period={self.teacher_period} must be in [0, 1]")

  @classmethod
  def default_choice_name(cls) -> str | None:
    return "sort"

  def make(self, rng: np.random.Generator) -> tuple[str, str]:
    """(prompt, answer) of one random problem."""
    raise NotImplementedError

  @property
  def correct_reward(self) -> str:
    """The registered reward that says a completion is correct (held-out accuracy, pass@k)."""
    return "exact_match"

  def well_formed(self, completion: str) -> bool:
    """Whether a completion has the answer's form (the `format` reward)."""
    return bool(completion)

  def demonstration(self, problem: Problem) -> str:
    """What the supervised warm-up is shown for `problem`: the answer, unless the config models a flawed
    teacher (`teacher_*` fields); the same for a problem every time it is shown."""
    rng = np.random.default_rng([problem.stream, problem.index, 7])
    content = self.teacher_answer(problem, rng)
    return content + ("." if rng.random() < self.teacher_period else "")

  def teacher_answer(self, problem: Problem, rng: np.random.Generator) -> str:
    """The teacher's answer before any trailing period (a subclass may model content mistakes)."""
    return problem.answer

  def demonstration_turns(self, problem: Problem) -> list[str]:
    """The teacher's turns for `problem` (single-turn sets: one, the demonstration)."""
    return [self.demonstration(problem)]

  def environment(self):
    """The class a fresh `environments.Environment` of each episode is made from (None: a single-turn set,
    scored by the reward plugins)."""
    return None

  def max_prompt_chars(self) -> int:
    """Longest prompt in characters (checked against the engine's context before compiling)."""
    raise NotImplementedError

  def max_answer_chars(self) -> int:
    """Longest answer in characters."""
    raise NotImplementedError

  def fingerprint(self) -> str:
    """A digest of every problem the set can give, for sets that read them from somewhere; "" when they are a
    pure function of the config, which every host already holds (`policy.spec.check_same_problems` compares it)."""
    return ""

  def problem(self, seed: int, stream: int, index: int) -> Problem:
    """Problem `index` of stream `stream` (a pure function of the three integers)."""
    prompt, answer = self.make(np.random.default_rng([seed, stream, index]))
    return Problem(prompt, answer, stream, index)

  def eval_set(self, seed: int) -> list[Problem]:
    """The held-out problems: the first eval_size distinct ones of EVAL_STREAM."""
    return list(_eval_set(self, seed))

  def train_problems(self, seed: int, stream: int, start: int, count: int) -> list[Problem]:
    """Training problems `start`..`start + count - 1` of stream `stream` (>= 1); one whose prompt is held out is
    drawn again under the same index. Indices are never shifted past a held-out prompt, so consecutive calls
    (a cursor, a worker's next files) never give one (stream, index), one episode key, twice."""
    if stream == EVAL_STREAM:
      raise ValueError(f"stream {EVAL_STREAM} holds the held-out problems; training streams start at 1")
    held_out = {p.prompt for p in _eval_set(self, seed)}
    return [self._training(seed, stream, i, held_out) for i in range(start, start + count)]

  def _training(self, seed: int, stream: int, index: int, held_out: set[str]) -> Problem:
    p = self.problem(seed, stream, index)
    for redraw in range(1, 1001):
      if p.prompt not in held_out:
        return p
      prompt, answer = self.make(np.random.default_rng([seed, stream, index, redraw]))
      p = Problem(prompt, answer, stream, index)
    raise ValueError(f"rl.problems: 1000 draws for training problem {index} of stream {stream} all gave held-out "
                     f"prompts; lower rl.problems.eval_size={self.eval_size} or make the problems harder")


@functools.lru_cache(maxsize=8)
def _eval_set(problems: ProblemSet, seed: int) -> tuple[Problem, ...]:
  out = streams.held_out(lambda i: problems.problem(seed, EVAL_STREAM, i), problems.eval_size, _prompt)
  if len(out) < problems.eval_size:
    raise ValueError(f"rl.problems: only {len(out)} distinct problems exist; lower rl.problems.eval_size="
                     f"{problems.eval_size}")
  return tuple(out)


def _prompt(problem: Problem) -> str:
  return problem.prompt
