"""The trainer's batch built from groups (`to_batch`, `Batcher`), and what hands the GRPO task its batches.

`to_batch`: G groups (`jaxpod.policy.rollout.groups.Group`) -> B = G*n rows of T tokens: max_prompt_len +
max_new_tokens (the engine options' `cache_len`), or with `grpo.trim_rows` the shortest length bucket holding the
batch's longest row (as TRL pads to the longest; a few programs, the same on every host since every host builds
the same batch):
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

from jaxpod.policy.rollout.groups import Group
from jaxpod.policy.task import host_share
from jaxpod.problems.environments import NO_VERSION
from jaxpod.rl import grpo


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


@dataclasses.dataclass(frozen=True)
class Batcher:
  """Groups -> this host's rows of the trainer's batch: every host builds the same global batch, keeps its share."""

  row_len: int  # tokens per row at most: the rollout options' cache_len (max_prompt_len + max_new_tokens)
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
  """What the GRPO task is handed (colocated `BatchSlot`, disaggregated `QueueSource`): an iterator of this host's
  batch rows with `get_state` / `set_state` (the data state of a checkpoint) and `hooks(graphdef, mesh)` (what keeps
  it filled)."""

  def __iter__(self):
    return self
