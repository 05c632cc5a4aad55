"""Rewards: plugins that score one completion, registered by name like problem sets; and `VerifiedProblems`.

    rewards: [exact_match, format]            # in an RL config, with optional reward_weights: [1.0, 0.1]
    rewards: [exact_match, my_pkg.scores:len_penalty]   # a user's function, imported by "module:function"

A reward is `fn(problem: Problem, completion: str, finished: bool) -> float`, where `completion`
is the decoded text without the stop token and `finished` says the sample ended with a stop
token (not the length limit). Register one with `@register_reward("name")`. Every name is
resolved when the config is checked, before anything compiles. A reward that raises while
scoring ends `jaxpod rl` with one line naming the plugin and the prompt, exit code 1 (the
config was valid: 2 is for input refused before the run; JAXPOD_TRACEBACK=1 shows the plugin's
traceback).

`VerifiedProblems` is what the warm-up, the evaluation and the rollouts share: the problem set, its rewards,
the run seed and the held-out evaluation's pass@k settings.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Callable, Sequence

from jaxpod.problems import verifiers
from jaxpod.problems.base import Problem, ProblemSet
from jaxpod.problems.passk import EvalConfig

RewardFn = Callable[[Problem, str, bool], float]
REWARDS: dict[str, Callable[[ProblemSet], RewardFn]] = {}  # name -> factory(problem set) -> reward fn


class RewardError(RuntimeError):
  """A reward plugin raised; the message names the plugin and the prompt."""

  one_line = True  # the command line prints the message alone, exit 1 (jaxpod.cli.main)


def register_reward(name: str):
  """Decorator: register `factory(problem_set) -> fn(problem, completion, finished)` under `name`."""
  def wrap(factory):
    REWARDS[name] = factory
    return factory
  return wrap


@register_reward("exact_match")
def _exact_match(problem_set: ProblemSet) -> RewardFn:
  """1 if the completion (whitespace stripped) is the answer and the sample stopped, else 0."""
  return lambda problem, completion, finished: float(finished and completion.strip() == problem.answer)


@register_reward("format")
def _format(problem_set: ProblemSet) -> RewardFn:
  """1 if the sample stopped and the completion has the answer's form (the set's `well_formed`), else 0."""
  return lambda problem, completion, finished: float(finished and problem_set.well_formed(completion.strip()))


@register_reward("gsm8k")
def _gsm8k(problem_set: ProblemSet) -> RewardFn:
  """1 if the sample stopped and the number after its last `####` equals the answer (math-verify), else 0."""
  return lambda problem, completion, finished: float(finished and verifiers.gsm8k_correct(completion, problem.answer))


@register_reward("boxed")
def _boxed(problem_set: ProblemSet) -> RewardFn:
  """1 if the sample stopped and its last `\\boxed{}` equals the answer (by value, or as normalised text), else 0."""
  return lambda problem, completion, finished: float(finished and verifiers.boxed_correct(completion, problem.answer))


def resolve(name: str, problem_set: ProblemSet) -> RewardFn:
  """The reward function `name` (registered, or "module:function"); one-line ValueError if neither."""
  if name in REWARDS:
    return REWARDS[name](problem_set)
  module, _, attr = name.partition(":")
  if attr:
    try:
      fn = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
      raise ValueError(f"rl.rewards: cannot import {name!r} ({type(e).__name__}: {e}); give a registered "
                       f"reward ({', '.join(sorted(REWARDS))}) or an importable 'module:function'") from None
    if callable(fn):
      return fn
  raise ValueError(f"rl.rewards: {name!r} is not a registered reward ({', '.join(sorted(REWARDS))}) nor an "
                   "importable 'module:function'")


class Scorer:
  """The weighted sum of the configured rewards, plus correctness for accuracy (the set's `correct_reward`)."""

  def __init__(self, names: Sequence[str], weights: Sequence[float], problem_set: ProblemSet):
    if not names:
      raise ValueError("rl.rewards is empty; name at least one reward (e.g. exact_match)")
    if weights and len(weights) != len(names):
      raise ValueError(f"rl.reward_weights has {len(weights)} values for {len(names)} rewards; give one per "
                       "reward or none (all 1.0)")
    self.names, self.weights = list(names), list(weights) or [1.0] * len(names)
    self.fns = [resolve(n, problem_set) for n in self.names]
    self.exact = resolve(problem_set.correct_reward, problem_set)

  def __call__(self, problem: Problem, completion: str, finished: bool) -> float:
    """The reward of one completion; RewardError naming the plugin and the prompt if one raises."""
    total = 0.0
    for name, w, fn in zip(self.names, self.weights, self.fns):
      try:
        total += w * float(fn(problem, completion, finished))
      except Exception as e:  # noqa: BLE001 - re-raised with context
        raise RewardError(f"reward {name!r} raised on prompt {problem.prompt!r} (stream {problem.stream}, "
                          f"problem {problem.index}): {type(e).__name__}: {e}") from e
    return total

  def correct(self, problem: Problem, completion: str, finished: bool) -> bool:
    """Whether the completion is correct by the set's verifier (what held-out accuracy counts)."""
    return bool(self.exact(problem, completion, finished))


@dataclasses.dataclass(frozen=True)
class VerifiedProblems:
  """The problems and how answers are scored: what the warm-up, the evaluation and the rollouts share."""

  problem_set: ProblemSet  # the problem streams and the held-out set
  rewards: tuple[str, ...]  # reward plugins, summed
  reward_weights: tuple[float, ...]  # one per reward (empty: all 1.0)
  seed: int  # the run seed: problems and request seeds derive from it
  evaluation: EvalConfig = EvalConfig()  # the held-out evaluation beside greedy accuracy (pass@k)

  def scorer(self) -> Scorer:
    """The configured rewards over this problem set."""
    return Scorer(self.rewards, self.reward_weights, self.problem_set)

  def eval_set(self) -> list[Problem]:
    """The held-out problems."""
    return self.problem_set.eval_set(self.seed)

  def train_problems(self, stream: int, start: int, count: int) -> list[Problem]:
    """`count` training problems of `stream` from index `start`."""
    return self.problem_set.train_problems(self.seed, stream, start, count)
