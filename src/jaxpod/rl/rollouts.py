"""Rollouts: scored groups of samples, the trainer's batch built from them, and their file format.

A `Group` is one problem's n samples as the engine returned them: every sampled token (the
stop token included), its log-prob under the distribution it was drawn from, and the weights
version that produced it (invariant 9), plus each sample's reward.

The trainer's batch (`to_batch`), G groups -> B = G*n rows of T = max_prompt_len + max_new_tokens:
  tokens      [B, T] int32    prompt (BOS first) then the sampled tokens, PAD after
  loss_mask   [B, T] int32    1 at position t when token t+1 is a sampled token (target-aligned)
  behaviour   [B, T] float32  the engine's log-prob of token t+1 there (target-aligned)
  advantages  [B]    float32  group-relative (`grpo.advantages`)
  reward      [B]    float32  the sample's reward;  correct [B] float32: exact match
Rows are group-major (sample j of group g is row g*n + j), so a host's contiguous slice of rows
holds whole groups whenever its share is a multiple of n. (Their file format is the queue's: `queue.py`.)
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from jaxpod.rl import grpo
from jaxpod.rl.tasks import Problem



@dataclasses.dataclass
class Group:
  """One problem's n scored samples."""

  problem: Problem
  prompt_ids: list[int]
  sampled: list[list[int]]  # per sample: every sampled token, the stop token included
  logprobs: list[list[float]]  # per sample, per sampled token
  versions: list[list[int]]  # per sample, per sampled token: the weights version that made it
  finished: list[bool]  # per sample: ended with a stop token (not the length limit)
  rewards: list[float]
  correct: list[bool]

  @property
  def n(self) -> int:
    return len(self.sampled)

  def oldest_version(self) -> int:
    """The oldest weights version behind any token of the group."""
    return min(min(v) for v in self.versions if v)

  def newest_version(self) -> int:
    return max(max(v) for v in self.versions if v)

  def tokens(self) -> int:
    return sum(len(s) for s in self.sampled)

  @property
  def mixed(self) -> bool:
    """Whether the samples' rewards differ (a group whose rewards are all equal has zero advantage)."""
    return len(set(self.rewards)) > 1


def make_group(problem: Problem, prompt_ids: Sequence[int], completions, texts: Sequence[str], scorer) -> Group:
  """A Group from the engine's n `Completion`s of one prompt and their decoded texts."""
  completions = sorted(completions, key=lambda c: c.sample)
  finished = [c.finish_reason == "stop" for c in completions]
  return Group(problem=problem, prompt_ids=list(prompt_ids),
               sampled=[list(c.sampled) for c in completions],
               logprobs=[[float(x) for x in c.logprobs] for c in completions],
               versions=[[int(v) for v in c.versions] for c in completions], finished=finished,
               rewards=[scorer(problem, t, f) for t, f in zip(texts, finished)],
               correct=[scorer.correct(problem, t, f) for t, f in zip(texts, finished)])


def to_batch(groups: Sequence[Group], length: int, pad_id: int, scale_rewards: str) -> dict[str, np.ndarray]:
  """The trainer's arrays for these groups (see the module docstring)."""
  n = groups[0].n
  if any(g.n != n for g in groups):
    raise ValueError(f"every group needs the same number of samples; got {sorted({g.n for g in groups})}")
  rows = len(groups) * n
  tokens = np.full((rows, length), pad_id, np.int32)
  mask = np.zeros((rows, length), np.int32)
  behaviour = np.zeros((rows, length), np.float32)
  adv = grpo.advantages(np.asarray([g.rewards for g in groups], np.float32), scale_rewards).reshape(-1)
  for g, group in enumerate(groups):
    p = len(group.prompt_ids)
    for j in range(n):
      b, s = g * n + j, group.sampled[j]
      if p + len(s) > length:
        raise ValueError(f"prompt {group.problem.prompt!r}: {p} prompt + {len(s)} sampled tokens exceed the "
                         f"row length {length}")
      tokens[b, :p], tokens[b, p:p + len(s)] = group.prompt_ids, s
      mask[b, p - 1:p - 1 + len(s)] = 1  # position t predicts token t+1
      behaviour[b, p - 1:p - 1 + len(s)] = group.logprobs[j]
  return {"tokens": tokens, "loss_mask": mask, "behaviour": behaviour, "advantages": adv,
          "reward": np.asarray([r for g in groups for r in g.rewards], np.float32),
          "correct": np.asarray([c for g in groups for c in g.correct], np.float32)}
