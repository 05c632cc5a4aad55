"""Groups: one problem's scored samples, and the trainer's batch built from them (`to_batch`, `Batcher`).

A `Group` is one problem's n samples as the engine returned them: every sampled token (the
stop token included), its log-prob under the distribution it was drawn from, and the weights
version that produced it (invariant 9), plus each sample's reward. Every sample is an episode: its
tokens after the prompt are the policy's turns and the environment's observations, and `from_policy`
says which is which; an observation token has no log-prob (0), no version (`NO_VERSION`) and is
never trained on. A single-turn sample is a one-turn episode: every token the policy's.

The trainer's batch (`to_batch`), G groups -> B = G*n rows of T tokens: max_prompt_len + max_new_tokens, or with
`grpo.trim_rows` the shortest length bucket holding the batch's longest row (as TRL pads to the longest; a few
programs, the same on every host since every host builds the same batch):
  tokens      [B, T] int32    prompt (BOS first) then the sampled tokens, PAD after
  loss_mask   [B, T] int32    1 at position t when token t+1 is a sampled token (target-aligned;
                              0 where token t+1 is an observation: it gets no gradient)
  behaviour   [B, T] float32  the engine's log-prob of token t+1 there (target-aligned)
  versions    [B, T] int32    the weights version of token t+1 there (NO_VERSION where none made it)
  advantages  [B]    float32  group-relative (`grpo.advantages`)
  reward      [B]    float32  the sample's reward;  correct [B] float32: exact match
Rows are group-major (sample j of group g is row g*n + j), so a host's contiguous slice of rows
holds whole groups whenever its share is a multiple of n; `Batcher` builds the global batch (every host the
same) and keeps this host's share. (Their file format is the queue's: `rl.disaggregated.queue`.)
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from jaxpod.problems.base import Problem
from jaxpod.problems.environments import NO_VERSION
from jaxpod.rl import grpo


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


def to_batch(groups: Sequence[Group], length: int, pad_id: int, scale_rewards: str) -> dict[str, np.ndarray]:
  """The trainer's arrays for these groups (see the module docstring)."""
  n = groups[0].n
  if any(g.n != n for g in groups):
    raise ValueError(f"every group needs the same number of samples; got {sorted({g.n for g in groups})}")
  rows = len(groups) * n
  tokens = np.full((rows, length), pad_id, np.int32)
  mask = np.zeros((rows, length), np.int32)
  behaviour = np.zeros((rows, length), np.float32)
  versions = np.full((rows, length), NO_VERSION, np.int32)
  adv = grpo.advantages(np.asarray([g.rewards for g in groups], np.float32), scale_rewards).reshape(-1)
  for g, group in enumerate(groups):
    p = len(group.prompt_ids)
    for j in range(n):
      b, s = g * n + j, group.sampled[j]
      if p + len(s) > length:
        raise ValueError(f"prompt {group.problem.prompt!r}: {p} prompt + {len(s)} sampled tokens exceed the "
                         f"row length {length}")
      tokens[b, :p], tokens[b, p:p + len(s)] = group.prompt_ids, s
      policy = np.asarray(group.from_policy[j], bool)
      targets = slice(p - 1, p - 1 + len(s))  # position t predicts token t+1
      mask[b, targets] = policy
      behaviour[b, targets] = np.where(policy, group.logprobs[j], 0.0)
      versions[b, targets] = group.versions[j]
  return {"tokens": tokens, "loss_mask": mask, "behaviour": behaviour, "advantages": adv, "versions": versions,
          "reward": np.asarray([r for g in groups for r in g.rewards], np.float32),
          "correct": np.asarray([c for g in groups for c in g.correct], np.float32)}


def host_share(arrays: dict[str, np.ndarray], host: int, hosts: int) -> dict[str, np.ndarray]:
  """Host `host`'s contiguous share of the global rows (of `hosts` equal shares)."""
  rows = next(iter(arrays.values())).shape[0]
  share = rows // hosts
  return {k: v[host * share:(host + 1) * share] for k, v in arrays.items()}


@dataclasses.dataclass(frozen=True)
class Batcher:
  """Groups -> this host's rows of the trainer's batch: every host builds the same global batch, keeps its share."""

  row_len: int  # tokens per row at most: rollout.max_prompt_len + max_new_tokens
  pad_id: int  # the tokenizer's PAD
  scale_rewards: str  # grpo.scale_rewards
  trim: bool = False  # grpo.trim_rows: rows end at the shortest length bucket that holds the longest

  def length(self, groups: Sequence[Group]) -> int:
    """Tokens per row of these groups' batch: row_len, or with `trim` the shortest bucket holding the longest row,
    32 tokens at least (a shorter step is cheap; another program is not). Every host builds the same batch, so
    every host compiles the same train step."""
    if not self.trim:
      return self.row_len
    from jaxpod.sample.config import length_buckets
    longest = max(len(g.prompt_ids) + len(s) for g in groups for s in g.sampled)
    # buckets from 16 so that 48 is one (the 1.5x steps start at twice the smallest); none below 32 is taken
    return next((n for n in length_buckets(16, self.row_len) if n >= max(longest, 32)), self.row_len)

  def global_batch(self, groups: Sequence[Group]) -> dict[str, np.ndarray]:
    """The global batch of these groups (without `versions`: admission already placed every token's version)."""
    arrays = to_batch(groups, self.length(groups), self.pad_id, self.scale_rewards)
    del arrays["versions"]
    return arrays

  def __call__(self, groups: Sequence[Group]) -> dict[str, np.ndarray]:
    """This host's share of the global batch of `groups`."""
    from jaxpod import runtime
    host = runtime.host_info()
    return host_share(self.global_batch(groups), host.process_index, host.process_count)


class BatchSource:
  """What the GRPO task is handed (colocated `RolloutBuffer`, disaggregated `QueueSource`): an iterator of this
  host's batch rows with `get_state` / `set_state` (the data state of a checkpoint) and `hooks(graphdef, mesh)`
  (what keeps it filled). Carried inside the task's config, it is never copied when the config is."""

  def __iter__(self):
    return self

  def __deepcopy__(self, memo) -> "BatchSource":  # dataclasses.asdict of the config that carries it
    return self

  def __repr__(self) -> str:  # what the GRPO run's config.json shows for its source
    return self.describe()

  def describe(self) -> str:
    """One line naming the source (its config.json entry)."""
    return type(self).__name__

