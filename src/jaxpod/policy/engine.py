"""The policy's engine: its options (`EngineOptions`, `jaxpod.sample`'s with the policy's defaults) and the Sampler
built from them (`make_sampler`), for rollouts, the held-out evaluation and the preference default's pairs.

    options = EngineOptions(temperature=1.0, max_prompt_len=16, max_new_tokens=8, batch_size=128)
    sampler = make_sampler(graphdef, params, mesh, options, policy.stop_ids)              # sampled rollouts
    greedy = make_sampler(graphdef, params, mesh, options, policy.stop_ids, greedy=True)  # eval_slots rows, argmax

A row of the policy is at most `options.cache_len` tokens (prompt + completion): the engine's KV row, and the
trainer's row of the same samples.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

from jaxpod.sample.config import EngineConfig, SamplingOptions, SamplingParams


@dataclasses.dataclass(frozen=True)
class EngineOptions(SamplingOptions):
  """The engine's sampling options (`jaxpod.sample.SamplingOptions`) with the policy's defaults, its greedy
  evaluation's slots, and whether a multi-turn episode keeps its KV between turns.

  n and seed are not the policy's to set here: samples per prompt and request seeds come from its trainer."""

  section: ClassVar[str] = "engine"
  temperature: float = 0.5  # sampling temperature > 0 (the trainer recomputes log-probs under the same distribution)
  max_prompt_len: int = 16  # prompt tokens (BOS included); longer prompts are refused before compiling
  max_new_tokens: int = 8  # tokens sampled per completion at most
  batch_size: int = 128  # decode slots of the engine (rows decoded together)
  steps_per_round: int = 4  # decode steps per device call between scheduling rounds
  eval_slots: int = 128  # decode slots of the greedy held-out evaluation
  keep_kv: bool = True  # multi-turn episodes: the engine keeps each episode's KV between turns (false: re-prefills it)

  def __post_init__(self):
    super().__post_init__()
    if self.temperature <= 0:
      raise ValueError(f"{self.section}.temperature={self.temperature}: RL samples at a temperature > 0 (its "
                       "log-probs define pi_behaviour); use e.g. 1.0")
    if self.n != 1:
      raise ValueError(f"{self.section}.n={self.n}: RL samples grpo.num_generations completions per prompt; set that")
    if self.seed != 0:
      raise ValueError(f"{self.section}.seed={self.seed}: rollout seeds derive from trainer.seed; set that")
    if self.eval_slots < 1:
      raise ValueError(f"{self.section}.eval_slots={self.eval_slots} must be >= 1")

  def engine(self, greedy: bool = False) -> EngineConfig:
    """The engine's static shapes for rollouts (greedy: for the held-out evaluation, eval_slots rows)."""
    return dataclasses.replace(super().engine(), batch_size=self.eval_slots if greedy else self.batch_size,
                               min_prefill_len=min(16, self.max_prompt_len))  # the policy's prompts are short

  def sampling(self, greedy: bool = False) -> SamplingParams:
    """How rollout tokens are drawn (greedy: argmax, for the held-out evaluation)."""
    return SamplingParams() if greedy else super().sampling()


def make_sampler(graphdef, params, mesh, options: EngineOptions, stop_ids, greedy: bool = False, version: int = 0):
  """A global-mode Sampler over `mesh` on `params` (in place where they are already in its inference layout, else
  resharded once per version; `update_params` swaps them)."""
  from flax import nnx
  from jaxpod.sample import Sampler
  stop_ids = tuple(stop_ids) + tuple(options.stop_token_ids)  # the policy's EOS ids and the user's extra ones
  return Sampler(nnx.merge(graphdef, params), mesh, options.engine(greedy), options.sampling(greedy), stop_ids,
                 mode="global", version=version)
