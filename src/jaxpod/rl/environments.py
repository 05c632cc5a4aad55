"""Multi-turn environments: the policy talks to a tool or a game; only its own tokens are trained on.

    env = make_environment("calculator")           # or "my_pkg.envs:Chess" (a class taking no arguments)
    first = env.reset(problem)                     # the first message: the prompt the policy sees
    observation, reward, done = env.step(completion)   # after each policy turn (decoded, stop token removed)

An episode is the prompt, then turns: the policy's sampled tokens (with their log-probs and the
weights version of each, invariant 9), then, unless the episode is done, the environment's
observation tokens, which the policy did not sample. `Episode` keeps one flag per token so that
the trainer's rows (`episode_rows`) carry a loss mask of the policy's tokens only: an observation
token has no behaviour log-prob and no advantage, so it gets no gradient. An episode that reaches
`max_turns` without `done` ends with reward 0.

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

from jaxpod.rl.tasks import Problem

NO_VERSION = -1  # version of an observation token (no weights made it)


class Environment(Protocol):
  """One episode's counterpart; a fresh instance per episode (`make_environment`)."""

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
      raise ValueError(f"rl.environment: cannot import {name!r} ({type(e).__name__}: {e})") from None
  raise ValueError(f"rl.environment: {name!r} is not a registered environment ({', '.join(sorted(ENVIRONMENTS))}) "
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
  done: bool = False

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


def run_episodes(generate, tokenizer, factory: Callable[[], Environment], problems: Sequence[Problem], n: int,
                 max_turns: int, seed: int) -> list[list[Episode]]:
  """n episodes per problem, turn by turn: `generate(contexts, seeds) -> completions` samples one turn of every
  open episode (each completion has .sampled, .logprobs, .versions and .tokens without the stop token).

  The context of the next turn is the whole episode so far (prompt, turns, observations); an engine
  that keeps the prefix's KV cache serves it from there, another recomputes it."""
  episodes, envs = [], []
  for p in problems:
    for _ in range(n):
      env = factory()
      first = env.reset(p)
      envs.append(env)
      episodes.append(Episode(p, tokenizer.encode(first)))
  for turn in range(max_turns):
    open_ = [i for i, e in enumerate(episodes) if not e.done]
    if not open_:
      break
    seeds = [(seed * 1_000_003 + i * 7_919 + turn) % (2 ** 31) for i in open_]
    for i, c in zip(open_, generate([episodes[i].context() for i in open_], seeds)):
      e = episodes[i]
      e.add_turn(c.sampled, c.logprobs, c.versions)
      observation, reward, done = envs[i].step(tokenizer.decode(c.tokens))
      e.reward += reward
      e.done = done
      if not done and turn + 1 < max_turns:
        e.add_observation(_continuation_ids(tokenizer, observation))
  return [episodes[g * n:(g + 1) * n] for g in range(len(problems))]


def _continuation_ids(tokenizer, text: str) -> list[int]:
  ids = tokenizer.encode(text)
  return ids[1:] if ids and tokenizer.bos_id is not None and ids[0] == tokenizer.bos_id else ids


def episode_rows(groups: Sequence[Sequence[Episode]], length: int, pad_id: int, scale_rewards: str) -> dict:
  """The trainer's arrays for groups of episodes, as `rollouts.to_batch` for single-turn groups:
  tokens [B, T], loss_mask [B, T] (1 where token t+1 came from the policy), behaviour [B, T], advantages [B]."""
  from jaxpod.rl import grpo
  n = len(groups[0])
  rows = len(groups) * n
  tokens = np.full((rows, length), pad_id, np.int32)
  mask = np.zeros((rows, length), np.int32)
  behaviour = np.zeros((rows, length), np.float32)
  versions = np.full((rows, length), NO_VERSION, np.int32)
  adv = grpo.advantages(np.asarray([[e.reward for e in g] for g in groups], np.float32), scale_rewards).reshape(-1)
  for b, e in enumerate(e for g in groups for e in g):
    p, k = len(e.prompt_ids), len(e.tokens)
    if p + k > length:
      raise ValueError(f"prompt {e.problem.prompt!r}: {p} prompt + {k} episode tokens exceed the row length {length}")
    tokens[b, :p], tokens[b, p:p + k] = e.prompt_ids, e.tokens
    policy = np.asarray(e.from_policy, bool)
    mask[b, p - 1:p - 1 + k] = policy  # position t predicts token t+1
    behaviour[b, p - 1:p - 1 + k] = np.where(policy, e.logprobs, 0.0)
    versions[b, p - 1:p - 1 + k] = e.versions
  return {"tokens": tokens, "loss_mask": mask, "behaviour": behaviour, "advantages": adv, "versions": versions,
          "reward": np.asarray([e.reward for g in groups for e in g], np.float32)}
