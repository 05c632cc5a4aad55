"""Verifiable tasks: seeded streams of (prompt, answer) problems, one registered config class each.

    task: {type: addition, digits: 3}          # in an RL config (a draccus choice, like `jaxpod train`'s task)

A task config is a frozen dataclass registered with `@RLTaskConfig.register_subclass("name")`; it
makes problem i of a stream from `numpy.random.default_rng([seed, stream, i])` alone, so any
host or worker can rebuild any problem from three integers (nothing but indices crosses the
control plane). The held-out set is the first `eval_size` distinct problems of stream
EVAL_STREAM; training streams skip every problem whose prompt is in it, so held-out accuracy
is measured on prompts the policy never trained on.

Built in (multi-turn: `calculator`, in `calculator_task.py`):
  addition   "a+b=" -> the decimal sum (operands of 1..digits digits)
  sort       "sort:3142=" -> "1234" (the digits in ascending order)
"""
from __future__ import annotations

import dataclasses
import functools
import draccus
import numpy as np

EVAL_STREAM = 0  # stream of the held-out problems; training streams are 1, 2, ...


@dataclasses.dataclass(frozen=True)
class Problem:
  """One prompt with its reference answer."""

  prompt: str  # what the policy is given, e.g. "123+456="
  answer: str  # the exact answer the reward checks, e.g. "579"
  stream: int = 0  # which seeded stream it came from
  index: int = 0  # its position in that stream


@dataclasses.dataclass(frozen=True)
class RLTaskConfig(draccus.ChoiceRegistry):
  """A seeded stream of problems with exact answers (subclasses: `addition`, `sort`)."""

  eval_size: int = 256  # held-out problems for accuracy (never trained on)
  teacher_period: float = 0.0  # warm-up demonstrations end with "." with this probability (exact match wants none)

  def __post_init__(self):
    if self.eval_size < 1:
      raise ValueError(f"rl.task.eval_size={self.eval_size} must be >= 1")
    if not 0.0 <= self.teacher_period <= 1.0:
      raise ValueError(f"rl.task.teacher_period={self.teacher_period} must be in [0, 1]")

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
    """The teacher's turns for `problem` (single-turn tasks: one, the demonstration)."""
    return [self.demonstration(problem)]

  def environment(self):
    """The class a fresh `environments.Environment` of each episode is made from (None: a single-turn task,
    scored by the reward plugins)."""
    return None

  def max_prompt_chars(self) -> int:
    """Longest prompt in characters (checked against the engine's context before compiling)."""
    raise NotImplementedError

  def max_answer_chars(self) -> int:
    """Longest answer in characters."""
    raise NotImplementedError

  def fingerprint(self) -> str:
    """A digest of every problem the task can give, for tasks that read them from somewhere; "" when they are a
    pure function of the config, which every host already holds (`check_same_problems` compares it)."""
    return ""

  def problem(self, seed: int, stream: int, index: int) -> Problem:
    """Problem `index` of stream `stream` (a pure function of the three integers)."""
    prompt, answer = self.make(np.random.default_rng([seed, stream, index]))
    return Problem(prompt, answer, stream, index)

  def eval_set(self, seed: int) -> list[Problem]:
    """The held-out problems: the first eval_size distinct ones of EVAL_STREAM."""
    return list(_eval_set(self, seed))

  def train_problems(self, seed: int, stream: int, start: int, count: int) -> list[Problem]:
    """`count` training problems of stream `stream` (>= 1) from index `start`, held-out prompts skipped."""
    if stream == EVAL_STREAM:
      raise ValueError(f"stream {EVAL_STREAM} holds the held-out problems; training streams start at 1")
    held_out = {p.prompt for p in _eval_set(self, seed)}
    out, i = [], start
    while len(out) < count:
      p = self.problem(seed, stream, i)
      if p.prompt not in held_out:
        out.append(p)
      i += 1
    return out


def check_same_problems(task: RLTaskConfig, job: str) -> None:
  """Every host of this job holds the same problems, or a one-line ValueError naming the hosts that differ.

  Hosts refer to problems by (stream, index) and the engine runs the same prompts on every host (invariant 1):
  a prompt file that differs between hosts' disks, or was rewritten between their reads, would have them
  train on different data without any error. One allgather of a digest at setup; nothing when the problems
  are a pure function of the config."""
  from jaxpod.runtime import control, state
  digest = task.fingerprint()
  if not digest or not state.in_multi_process_job():
    return
  seen = control.allgather(digest, f"rl.task.fingerprint.{job}")
  differ = [h for h, d in enumerate(seen) if d != seen[0]]
  if differ:
    source = getattr(task, "path", "the task's source")
    raise ValueError(f"rl.task: {job} host(s) {differ} read other problems from {source} than host 0 (digests "
                     f"{seen[differ[0]][:12]} vs {seen[0][:12]}); every host must read the same file: put it in "
                     "the bucket (gs://...) or copy the same version to every host, and do not rewrite it while "
                     "a job starts")


@functools.lru_cache(maxsize=8)
def _eval_set(task: RLTaskConfig, seed: int) -> tuple[Problem, ...]:
  seen, out, i = set(), [], 0
  while len(out) < task.eval_size:
    p = task.problem(seed, EVAL_STREAM, i)
    if p.prompt not in seen:
      seen.add(p.prompt)
      out.append(p)
    i += 1
    if i > 100 * task.eval_size:
      raise ValueError(f"rl.task: only {len(out)} distinct problems exist; lower rl.task.eval_size={task.eval_size}")
  return tuple(out)


@RLTaskConfig.register_subclass("addition")
@dataclasses.dataclass(frozen=True)
class AdditionTask(RLTaskConfig):
  """"a+b=" -> a + b in decimal; each operand has 1..digits digits (uniform length, then uniform value).

  `teacher_carry_slip`: the warm-up's teacher forgets each carry with that probability (the exact-match
  reward always checks the true sum)."""

  digits: int = 3  # most digits per operand
  teacher_carry_slip: float = 0.0  # warm-up demonstrations drop each carry with this probability (0: correct)

  def __post_init__(self):
    super().__post_init__()
    if not 1 <= self.digits <= 9:
      raise ValueError(f"rl.task.digits={self.digits} must be in 1..9")
    if not 0.0 <= self.teacher_carry_slip <= 1.0:
      raise ValueError(f"rl.task.teacher_carry_slip={self.teacher_carry_slip} must be in [0, 1]")

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


@RLTaskConfig.register_subclass("sort")
@dataclasses.dataclass(frozen=True)
class SortTask(RLTaskConfig):
  """"sort:3142=" -> "1234": `length` random digits in ascending order."""

  length: int = 6  # digits per problem (the most, with min_length)
  min_length: int = 0  # fewest digits per problem (0: always `length`); lengths are uniform in between
  teacher_dedup: float = 0.0  # warm-up demonstrations drop repeated digits with this probability ("1123" -> "123")

  def __post_init__(self):
    super().__post_init__()
    if not 2 <= self.length <= 32:
      raise ValueError(f"rl.task.length={self.length} must be in 2..32")
    if self.min_length and not 1 <= self.min_length <= self.length:
      raise ValueError(f"rl.task.min_length={self.min_length} must be in 1..length={self.length} (or 0)")
    if not 0.0 <= self.teacher_dedup <= 1.0:
      raise ValueError(f"rl.task.teacher_dedup={self.teacher_dedup} must be in [0, 1]")

  def teacher_answer(self, problem: Problem, rng: np.random.Generator) -> str:
    """The sorted digits, each repeat of a digit left out with probability teacher_dedup."""
    from jaxpod.data.sort_digits import teacher_habit
    return teacher_habit(problem.answer, rng, self.teacher_dedup)

  def make(self, rng):
    n = int(rng.integers(self.min_length, self.length + 1)) if self.min_length else self.length
    digits = rng.integers(0, 10, n)
    return f"sort:{''.join(map(str, digits))}=", "".join(map(str, sorted(digits)))

  def well_formed(self, completion: str) -> bool:
    return completion.isdigit() and (self.min_length or self.length) <= len(completion) <= self.length

  def max_prompt_chars(self) -> int:
    return self.length + 6

  def max_answer_chars(self) -> int:
    return self.length + 1  # the digits and a teacher's period
