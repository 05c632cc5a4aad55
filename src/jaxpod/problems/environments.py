"""Multi-turn environments: the policy talks to a tool or a game; only its own tokens are trained on.

Run the built-in example (colocated; the embedded `configs/rl_calculator.yaml`):

    jaxpod rl --task.type calculator                       # warm-up on a flawed teacher, then GRPO on episodes
    jaxpod rl --task.type calculator --task.max_turns 4 --task.environment_name my_pkg.envs:Abacus

Write an environment: a class made with no arguments, a fresh one per episode, with two methods:

    @register_environment("abacus")                        # or name it as "my_pkg.envs:Abacus"
    class Abacus:
      def reset(self, problem: Problem) -> str:            # the first message: the prompt the policy sees
        self.problem = problem
        return problem.prompt
      def step(self, completion: str) -> tuple[str, float, bool]:
        # after each policy turn (decoded, stop token removed): (observation, reward, done)
        ...

Every host of the job runs the same episodes (the engine's global mode), so `step` must be a
deterministic function of the episode so far (a seeded game, a pure tool). The observation is
appended to the context as text (tokenized, no BOS) and the policy's next turn
continues from the whole episode; the episode's reward is the sum of the step rewards, and an
episode counts as solved (held-out accuracy, pass@k) when `done` came with a positive reward. A task
opts in by returning the environment class from `RLTaskConfig.environment()` (and, for its warm-up,
the teacher's turns from `demonstration_turns`; `calculator_task.py` is the example).

An episode is the prompt, then turns: the policy's sampled tokens (with their log-probs and the
weights version of each, invariant 9), then, unless the episode ended, the environment's
observation tokens, which the policy did not sample. `Episode` keeps one flag per token, and
`episode_group` makes a problem's n episodes one `rollouts.Group` with those flags, so admission
(`grpo.take`) and the trainer's rows (`rollouts.to_batch`) are the single-turn ones: the loss mask
covers the policy's tokens only, and an observation token has no behaviour log-prob, no version and
no advantage, so it gets no gradient. An episode ends when the environment says done, after
`max_turns` turns, or when its next context would not fit the engine's `max_prompt_len` (its last
token is always the policy's).

Every turn recomputes the episode's context from scratch (the engine's prefill); the prefix's KV
cache is not kept across turns yet.

Built in:
  calculator   "Compute 4821*7395." -> the product; the policy may write `calc: <expression>` and
               receives `= <value>` (the arithmetic is beyond a small policy; the tool is not)
"""
from __future__ import annotations

import dataclasses
import importlib
import re
from typing import Callable, Protocol, Sequence

import numpy as np

from jaxpod.rl.rollouts import NO_VERSION, Group, answer_ids
from jaxpod.rl.tasks import Problem


class Environment(Protocol):
  """One episode's counterpart; a fresh instance per episode (`environment_factory(name)()`)."""

  def reset(self, problem: Problem) -> str:
    """The first message of the episode: what the policy is prompted with."""

  def step(self, completion: str) -> tuple[str, float, bool]:
    """(observation appended to the context, reward, done) after one policy turn."""


ENVIRONMENTS: dict[str, Callable[[], Environment]] = {}


def register_environment(name: str):
  """Decorator: register an Environment class (made with no arguments) under `name`."""
  def wrap(cls):
    ENVIRONMENTS[name] = cls
    return cls
  return wrap


def environment_factory(name: str) -> Callable[[], Environment]:
  """The class `name` (registered, or "module:Class"); one-line ValueError if neither."""
  if name in ENVIRONMENTS:
    return ENVIRONMENTS[name]
  module, _, attr = name.partition(":")
  if attr:
    try:
      return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
      raise ValueError(f"rl.task.environment_name: cannot import {name!r} ({type(e).__name__}: {e})") from None
  raise ValueError(f"rl.task.environment_name: {name!r} is not a registered environment ({', '.join(sorted(ENVIRONMENTS))}) "
                   "nor an importable 'module:Class'")


# ----------------------------------------------------------------------------- the calculator
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


# ----------------------------------------------------------------------------- episodes
@dataclasses.dataclass
class Episode:
  """One multi-turn sample: the prompt, then every later token with who made it."""

  problem: Problem
  prompt_ids: list[int]
  tokens: list[int] = dataclasses.field(default_factory=list)  # after the prompt: policy and observation tokens
  from_policy: list[bool] = dataclasses.field(default_factory=list)  # per token: the policy sampled it
  logprobs: list[float] = dataclasses.field(default_factory=list)  # per token: behaviour log-prob (0: observation)
  versions: list[int] = dataclasses.field(default_factory=list)  # per token: weights version (NO_VERSION: observation)
  reward: float = 0.0
  turns: int = 0
  done: bool = False  # the environment ended it (not the turn limit, nor the context length)

  @property
  def solved(self) -> bool:
    """The environment ended the episode with a positive reward (what held-out accuracy counts)."""
    return self.done and self.reward > 0

  def context(self) -> list[int]:
    """What the policy continues from: the prompt and every token so far."""
    return self.prompt_ids + self.tokens

  def add_turn(self, sampled: Sequence[int], logprobs: Sequence[float], versions: Sequence[int]) -> None:
    """Append the policy's tokens of one turn."""
    self.tokens += list(sampled)
    self.from_policy += [True] * len(sampled)
    self.logprobs += [float(x) for x in logprobs]
    self.versions += [int(v) for v in versions]
    self.turns += 1

  def add_observation(self, ids: Sequence[int]) -> None:
    """Append the environment's tokens (no log-prob, no version, never trained on)."""
    self.tokens += list(ids)
    self.from_policy += [False] * len(ids)
    self.logprobs += [0.0] * len(ids)
    self.versions += [NO_VERSION] * len(ids)


def turn_seed(seed: int, problem: Problem, sample: int, turn: int) -> int:
  """The engine seed of one turn of one episode: a pure function of the run seed, the problem's stream and
  index, the sample and the turn (not of batching, slots, hosts or restarts)."""
  return (seed * 1_000_003 + problem.stream * 7_919 + problem.index * 104_729 + sample * 15_485_863
          + turn * 32_452_843) % (2 ** 31)


def run_episodes(generate, tokenizer, factory: Callable[[], Environment], problems: Sequence[Problem], n: int,
                 max_turns: int, seed: int, max_context: int | None = None) -> list[list[Episode]]:
  """n episodes per problem, turn by turn: `generate(contexts, seeds) -> completions` samples one turn of every
  open episode (each completion has .sampled, .logprobs, .versions and .tokens without the stop token).

  The context of the next turn is the whole episode so far (prompt, turns, observations); an engine
  that keeps the prefix's KV cache serves it from there, another recomputes it. An episode ends when
  the environment says done, after `max_turns` turns, or when its next context would exceed
  `max_context` tokens (the engine's prompt limit); only the first counts as `done`."""
  episodes, envs = [], []
  for p in problems:
    for _ in range(n):
      env = factory()
      envs.append(env)
      episodes.append(Episode(p, tokenizer.encode(env.reset(p))))
  open_ = list(range(len(episodes)))
  for turn in range(max_turns):
    if not open_:
      break
    seeds = [turn_seed(seed, episodes[i].problem, i % n, turn) for i in open_]
    still = []
    for i, c in zip(open_, generate([episodes[i].context() for i in open_], seeds)):
      e = episodes[i]
      e.add_turn(c.sampled, c.logprobs, c.versions)
      observation, reward, done = envs[i].step(tokenizer.decode(c.tokens))
      e.reward += reward
      e.done = done
      ids = answer_ids(tokenizer, observation)
      if done or turn + 1 == max_turns or (max_context is not None and len(e.context()) + len(ids) > max_context):
        continue  # ended: the last token of an episode is always the policy's
      e.add_observation(ids)
      still.append(i)
    open_ = still
  return [episodes[g * n:(g + 1) * n] for g in range(len(problems))]


def episode_group(episodes: Sequence[Episode]) -> Group:
  """One problem's n episodes as a `rollouts.Group` (what admission and the trainer's batch take): every token
  after the prompt, `from_policy` marking the policy's; the reward is the episode's, correct means solved."""
  return Group(problem=episodes[0].problem, prompt_ids=list(episodes[0].prompt_ids),
               sampled=[list(e.tokens) for e in episodes], logprobs=[list(e.logprobs) for e in episodes],
               versions=[list(e.versions) for e in episodes], finished=[e.done for e in episodes],
               rewards=[e.reward for e in episodes], correct=[e.solved for e in episodes],
               from_policy=[list(e.from_policy) for e in episodes])


@dataclasses.dataclass(frozen=True)
class Episodes:
  """How a multi-turn task's samples are made: episodes with fresh environments, turn and context limits."""

  factory: Callable[[], Environment]  # a fresh environment per episode
  max_turns: int  # policy turns per episode at most
  max_context: int  # tokens a turn may continue from (the engine's max_prompt_len)

  def groups(self, generate, tokenizer, problems: Sequence[Problem], n: int, seed: int) -> list[Group]:
    """Every problem's n episodes as a Group, in order (`run_episodes`, then `episode_group`)."""
    return [episode_group(g) for g in run_episodes(generate, tokenizer, self.factory, problems, n, self.max_turns,
                                                   seed, self.max_context)]


class SingleTurn:
  """The environment of a single-turn task: the prompt, one turn, done (its reward plugins score the turn)."""

  def reset(self, problem: Problem) -> str:
    return problem.prompt

  def step(self, completion: str) -> tuple[str, float, bool]:
    return "", 0.0, True


def demonstration(task, tokenizer, problem: Problem, stop_id: int) -> Episode:
  """The warm-up's episode for `problem`: the teacher's turns (`task.demonstration_turns`) with the environment's
  observations between them; a single-turn task's is the prompt, the demonstration and `stop_id`."""
  return replay(task.environment() or SingleTurn, tokenizer, problem, task.demonstration_turns(problem), stop_id)


def replay(factory: Callable[[], Environment], tokenizer, problem: Problem, turns: Sequence[str],
           stop_id: int) -> Episode:
  """The episode of a scripted policy writing `turns` (each followed by `stop_id`): a warm-up demonstration.

  The environment answers each turn as it would a sampled one; a script that outlives the episode is cut."""
  env = factory()
  e = Episode(problem, tokenizer.encode(env.reset(problem)))
  for k, text in enumerate(turns):
    ids = answer_ids(tokenizer, text) + [stop_id]
    e.add_turn(ids, [0.0] * len(ids), [NO_VERSION] * len(ids))
    observation, reward, done = env.step(text)
    e.reward += reward
    e.done = done
    if done:
      break
    if k + 1 < len(turns):
      e.add_observation(answer_ids(tokenizer, observation))
  return e
