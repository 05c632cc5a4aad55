"""From problems to scored groups through the continuous engine (a `jaxpod.sample.Sampler`: `engine.make_sampler`).

    roller = Roller(sampler, tokenizer, scorer, n=8, seed=0, samples=samples_for(problems, max_context))
    groups = roller.run(problems)                      # colocated: every host, the same calls
    roller.submit(problems); groups = roller.collect(sampler.step())   # workers: between weight swaps

Request seeds are a pure function of (run seed, problem stream, problem index), so a problem's
samples do not depend on batching, slots, hosts or restarts.

`run`, `accuracy` and `pass_at_k` take their samples from `episodes.samples_for`: one turn per problem, or episodes
for a multi-turn set (the engine driven round by round, the observations that have arrived joining at each idle point,
each turn's seed fixed the same way; an episode is correct when it is solved). `submit` / `collect` serve one-turn
samples only (`continuous`); a disaggregated worker on a multi-turn set calls `run` (see its loop).
"""
from __future__ import annotations

from typing import Sequence

from jaxpod.policy.rollout.episodes import OneTurn, group, request_seed
from jaxpod.policy.rollout.groups import Group
from jaxpod.problems.base import Problem
from jaxpod.problems.rewards import Scorer


class Roller:
  """Turns problems into scored `Group`s of n samples with one Sampler."""

  def __init__(self, sampler, tokenizer, scorer: Scorer, n: int, seed: int, samples=None):
    self.sampler, self.tokenizer, self.scorer, self.n, self.seed = sampler, tokenizer, scorer, n, seed
    self.samples = samples or OneTurn(scorer)  # `episodes.samples_for`: one turn, or a multi-turn set's episodes
    self._open: dict[int, tuple[Problem, list[int], list]] = {}  # request -> (problem, prompt ids, completions)
    self.tokens = 0  # sampled tokens so far
    self.prefill_tokens = 0  # real tokens `run` prefilled so far (a kept episode's turn: its new tokens only)
    self.context_tokens = 0  # distinct tokens of `run`'s samples so far (prompt + every token after it, each)

  def run(self, problems: Sequence[Problem]) -> list[Group]:
    """Every problem's group, in order (runs the engine to completion)."""
    groups = self.samples.groups(self.sampler, self.tokenizer, problems, self.n, self.seed)
    self.prefill_tokens += self.sampler.last.prefill_prompt_tokens  # one schedule: the one-turn call, or `begin`'s
    self.tokens += sum(g.policy_tokens() for g in groups)
    self.context_tokens += sum(len(g.prompt_ids) + len(s) for g in groups for s in g.sampled)
    return groups

  @property
  def continuous(self) -> bool:
    """Whether samples stream through `submit` / `collect` (one turn each); else `run` makes whole episodes."""
    return isinstance(self.samples, OneTurn)

  def submit(self, problems: Sequence[Problem]) -> None:
    """Queue problems on the engine (one turn each); their groups come back from `collect` as they finish."""
    ids = [self.tokenizer.encode(p.prompt) for p in problems]
    handles = self.sampler.submit(ids, [request_seed(self.seed, p) for p in problems], n=self.n)
    for handle, p, row in zip(handles, problems, ids):
      self._open[handle] = (p, row, [])

  @property
  def open_groups(self) -> int:
    """Submitted problems whose group is not complete yet."""
    return len(self._open)

  def collect(self, completions) -> list[Group]:
    """Groups completed by these finished samples (from `sampler.step()`)."""
    done = []
    for c in completions:
      problem, row, got = self._open[c.request]
      got.append(c)
      if len(got) == self.n:
        del self._open[c.request]
        done.append(group(self.scorer, self.tokenizer, problem, row, got))
        self.tokens += done[-1].policy_tokens()
    return done


def accuracy(sampler, tokenizer, problems: Sequence[Problem], samples) -> dict:
  """Greedy accuracy over `problems`: exact match by the set's verifier, or the fraction of greedy episodes solved
  (every host calls it; global mode)."""
  right = [g.correct[0] for g in samples.groups(sampler, tokenizer, problems, 1, 0)]
  return {"accuracy": sum(right) / len(right), "count": len(right)}


def pass_at_k(sampler, tokenizer, problems: Sequence[Problem], n: int, k: int, seed: int, samples) -> dict:
  """pass@1 and pass@k over `problems` from `n` samples (or episodes) each (unbiased estimator; every host calls it).

  Request seeds are fixed per problem, so two evaluations differ only by the policy."""
  from jaxpod.problems.passk import mean_pass_at_k
  counts = [(n, sum(g.correct)) for g in samples.groups(sampler, tokenizer, problems, n, seed)]
  return {"pass_at_1": mean_pass_at_k(counts, 1), f"pass_at_{k}": mean_pass_at_k(counts, k), "pass_k": k,
          "pass_samples": n}
