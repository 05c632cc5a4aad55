"""Groups: one problem's scored samples (`Group`), as the engine returned them.

A `Group` is one problem's n samples: every sampled token (the stop token included), its log-prob under the
distribution it was drawn from, and the weights version that produced it (invariant 9), plus each sample's
reward. Every sample is an episode: its tokens after the prompt are the policy's turns and the environment's
observations, and `from_policy` says which is which; an observation token has no log-prob (0), no version
(`NO_VERSION`) and is never trained on. A single-turn sample is a one-turn episode: every token the policy's.
The trainer's rows of them are RL's (`jaxpod.rl.batch`).
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

from jaxpod.problems.base import Problem
from jaxpod.problems.environments import NO_VERSION


@dataclasses.dataclass
class Group:
  """One problem's n scored samples."""

  problem: Problem
  prompt_ids: list[int]
  sampled: list[list[int]]  # per sample: every token after the prompt (the stop token included; episodes: observations too)
  logprobs: list[list[float]]  # per sample, per sampled token
  versions: list[list[int]]  # per sample, per sampled token: the weights version that made it (NO_VERSION: observation)
  finished: list[bool]  # per sample: ended with a stop token (not the length limit); episodes: the environment ended it
  rewards: list[float]
  correct: list[bool]
  from_policy: list[list[bool]] | None = None  # per sample, per token: the policy sampled it (left out: every token)

  def __post_init__(self):
    if self.from_policy is None:  # a one-turn episode: every token the policy's
      self.from_policy = [[True] * len(s) for s in self.sampled]

  @property
  def n(self) -> int:
    return len(self.sampled)

  def oldest_version(self) -> int:
    """The oldest weights version behind any token of the group (observation tokens have none)."""
    return min(v for vs in self.versions for v in vs if v != NO_VERSION)

  def newest_version(self) -> int:
    return max(v for vs in self.versions for v in vs if v != NO_VERSION)

  def tokens(self) -> int:
    return sum(len(s) for s in self.sampled)

  def policy_tokens(self) -> int:
    """Tokens the policy sampled (an episode's observations left out)."""
    return sum(map(sum, self.from_policy))

  @property
  def mixed(self) -> bool:
    """Whether the samples' rewards differ (a group whose rewards are all equal has zero advantage)."""
    return len(set(self.rewards)) > 1


def make_group(problem: Problem, prompt_ids: Sequence[int], completions, texts: Sequence[str], scorer) -> Group:
  """A Group from the engine's n `Completion`s of one prompt and their decoded texts (same order, any order: the
  continuous engine hands samples back as they finish; the group keeps them in sample order)."""
  if len(texts) != len(completions):
    raise ValueError(f"{len(completions)} completions but {len(texts)} texts for prompt {problem.prompt!r}")
  order = sorted(range(len(completions)), key=lambda i: completions[i].sample)  # each text stays with its tokens
  completions, texts = [completions[i] for i in order], [texts[i] for i in order]
  finished = [c.finish_reason == "stop" for c in completions]
  return Group(problem=problem, prompt_ids=list(prompt_ids),
               sampled=[list(c.sampled) for c in completions],
               logprobs=[[float(x) for x in c.logprobs] for c in completions],
               versions=[[int(v) for v in c.versions] for c in completions], finished=finished,
               from_policy=[[True] * len(c.sampled) for c in completions],
               rewards=[scorer(problem, t, f) for t, f in zip(texts, finished)],
               correct=[scorer.correct(problem, t, f) for t, f in zip(texts, finished)])
