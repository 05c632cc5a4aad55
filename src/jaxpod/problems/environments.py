"""Environments and episodes: what a multi-turn problem set's policy talks to, and what an episode records.

Write an environment: a class made with no arguments, a fresh one per episode, with two methods:

    @register_environment("abacus")                        # or name it as "my_pkg.envs:Abacus"
    class Abacus:
      def reset(self, problem: Problem) -> str:            # the first message: the prompt the policy sees
        self.problem = problem
        return problem.prompt
      def step(self, completion: str) -> tuple[str, float, bool]:
        # after each policy turn (decoded, stop token removed): (observation, reward, done)
        ...

    jaxpod rl --problems.type calculator --problems.max_turns 4 --problems.environment_name my_pkg.envs:Abacus

Every host of the job runs the same episodes (the engine's global mode), so `step` must be a
deterministic function of the episode so far (a seeded game, a pure tool). The observation is
appended to the context as text (tokenized, no BOS) and the policy's next turn continues from the
whole episode; the episode's reward is the sum of the step rewards, and an episode counts as solved
(held-out accuracy, pass@k) when `done` came with a positive reward. A problem set opts in by
returning the environment class from `ProblemSet.environment()` (and, for its warm-up, the teacher's
turns from `demonstration_turns`; `calculator.py` is the example). A single-turn set's episode is
the prompt, one turn, done (`SingleTurn`).

An `Episode` is the prompt, then turns: the policy's sampled tokens (with their log-probs and the
weights version of each, invariant 9), then, unless the episode ended, the environment's
observation tokens, which the policy did not sample (no log-prob, version NO_VERSION, never trained
on). The loop that samples episodes with the engine is `jaxpod.policy.rollout.episodes`; the warm-up's
demonstrations are scripted episodes (`demonstration`, `replay`).
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Callable, Protocol, Sequence

from jaxpod.problems.base import Problem

NO_VERSION = -1  # version of a token no weights made (an environment's observation)


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
      raise ValueError(f"rl.problems.environment_name: cannot import {name!r} ({type(e).__name__}: {e})") from None
  raise ValueError(f"rl.problems.environment_name: {name!r} is not a registered environment "
                   f"({', '.join(sorted(ENVIRONMENTS))}) "
                   "nor an importable 'module:Class'")


def answer_ids(tokenizer, text: str) -> list[int]:
  """Token ids of `text` as the policy would generate it after a prompt (no BOS)."""
  ids = tokenizer.encode(text)
  return ids[1:] if ids and tokenizer.bos_id is not None and ids[0] == tokenizer.bos_id else ids


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


class SingleTurn:
  """The environment of a single-turn problem set: the prompt, one turn, done (its reward plugins score the turn)."""

  def reset(self, problem: Problem) -> str:
    return problem.prompt

  def step(self, completion: str) -> tuple[str, float, bool]:
    return "", 0.0, True


def demonstration(problem_set, tokenizer, problem: Problem, stop_id: int) -> Episode:
  """The warm-up's episode for `problem`: the teacher's turns (`problem_set.demonstration_turns`) with the
  environment's observations between them; a single-turn set's is the prompt, the demonstration and `stop_id`."""
  return replay(problem_set.environment() or SingleTurn, tokenizer, problem, problem_set.demonstration_turns(problem),
                stop_id)


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
