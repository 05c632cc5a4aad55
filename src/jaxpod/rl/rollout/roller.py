"""From problems to scored groups through the continuous engine (`jaxpod.sample.Sampler`).

    roller = Roller(sampler, tokenizer, scorer, n=8, seed=0)
    groups = roller.run(problems)                      # colocated: every host, the same calls
    roller.submit(problems); groups = roller.collect(sampler.step())   # workers: between weight swaps

Request seeds are a pure function of (run seed, problem stream, problem index), so a problem's
samples do not depend on batching, slots, hosts or restarts.

A multi-turn task (`episodes` given) samples episodes instead (`environments.Episodes`: one engine
call per turn over every open episode, each turn's seed fixed the same way); its groups, accuracy and
pass@k count an episode as correct when it is solved. Only `run` serves episodes (colocated).
"""
from __future__ import annotations

from typing import Sequence

from jaxpod.rl.config import RolloutConfig
from jaxpod.rl.rewards import Scorer
from jaxpod.rl.rollouts import Group, make_group
from jaxpod.rl.tasks import Problem


def request_seed(seed: int, problem: Problem) -> int:
  """The engine seed of a problem's request (its n samples fold in their index)."""
  return (seed * 1_000_003 + problem.stream * 7_919 + problem.index) % (2 ** 31)


def make_sampler(graphdef, params, mesh, rollout: RolloutConfig, stop_ids, greedy: bool = False, version: int = 0):
  """A global-mode Sampler over `mesh` reading `params` in place (no copy; `update_params` swaps them)."""
  from flax import nnx
  from jaxpod.sample import Sampler
  stop_ids = tuple(stop_ids) + tuple(rollout.stop_token_ids)  # the policy's EOS ids and the user's extra ones
  return Sampler(nnx.merge(graphdef, params), mesh, rollout.engine(greedy), rollout.sampling(greedy), stop_ids,
                 mode="global", version=version)


class Roller:
  """Turns problems into scored `Group`s of n samples with one Sampler."""

  def __init__(self, sampler, tokenizer, scorer: Scorer, n: int, seed: int, episodes=None):
    self.sampler, self.tokenizer, self.scorer, self.n, self.seed = sampler, tokenizer, scorer, n, seed
    self.episodes = episodes  # environments.Episodes of a multi-turn task, else None
    self._open: dict[int, tuple[Problem, list[int], list]] = {}  # request -> (problem, prompt ids, completions)
    self.tokens = 0  # sampled tokens so far

  def _requests(self, problems: Sequence[Problem]):
    ids = [self.tokenizer.encode(p.prompt) for p in problems]
    return ids, [request_seed(self.seed, p) for p in problems]

  def run(self, problems: Sequence[Problem]) -> list[Group]:
    """Every problem's group, in order (runs the engine to completion)."""
    if self.episodes is not None:
      groups = self.episodes.groups(self.sampler.generate, self.tokenizer, problems, self.n, self.seed)
      self.tokens += sum(sum(mine) for g in groups for mine in g.from_policy)
      return groups
    ids, seeds = self._requests(problems)
    outs = self.sampler.generate(ids, seeds, n=self.n)
    return [self._group(p, ids[i], outs[i * self.n:(i + 1) * self.n]) for i, p in enumerate(problems)]

  def submit(self, problems: Sequence[Problem]) -> None:
    """Queue problems on the engine; their groups come back from `collect` as they finish."""
    ids, seeds = self._requests(problems)
    for handle, p, row in zip(self.sampler.submit(ids, seeds, n=self.n), problems, ids):
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
        done.append(self._group(problem, row, got))
    return done

  def _group(self, problem: Problem, prompt_ids, completions) -> Group:
    texts = [self.tokenizer.decode(c.tokens) for c in completions]
    self.tokens += sum(len(c.sampled) for c in completions)
    return make_group(problem, prompt_ids, completions, texts, self.scorer)


def accuracy(sampler, tokenizer, scorer: Scorer, problems: Sequence[Problem], episodes=None) -> dict:
  """Greedy exact-match accuracy over `problems`, or the fraction of greedy episodes solved (every host calls it;
  global mode)."""
  if episodes is not None:
    right = [g.correct[0] for g in episodes.groups(sampler.generate, tokenizer, problems, 1, 0)]
    return {"accuracy": sum(right) / len(right), "count": len(right)}
  ids = [tokenizer.encode(p.prompt) for p in problems]
  outs = sampler.generate(ids, [0] * len(ids))
  right = [scorer.correct(p, tokenizer.decode(c.tokens), c.finish_reason == "stop") for p, c in zip(problems, outs)]
  return {"accuracy": sum(right) / len(right), "count": len(right)}


def pass_at_k(sampler, tokenizer, scorer: Scorer, problems: Sequence[Problem], samples: int, k: int,
              seed: int, episodes=None) -> dict:
  """pass@1 and pass@k over `problems` from `samples` samples (or episodes) each (unbiased estimator; every host
  calls it).

  Request seeds are fixed per problem, so two evaluations differ only by the policy."""
  from jaxpod.rl.passk import mean_pass_at_k
  if episodes is not None:
    counts = [(samples, sum(g.correct)) for g in episodes.groups(sampler.generate, tokenizer, problems, samples, seed)]
  else:
    ids = [tokenizer.encode(p.prompt) for p in problems]
    outs = sampler.generate(ids, [request_seed(seed, p) for p in problems], n=samples)
    counts = []
    for i, p in enumerate(problems):
      group = outs[i * samples:(i + 1) * samples]
      counts.append((samples, sum(scorer.correct(p, tokenizer.decode(c.tokens), c.finish_reason == "stop")
                                  for c in group)))
  return {"pass_at_1": mean_pass_at_k(counts, 1), f"pass_at_{k}": mean_pass_at_k(counts, k), "pass_k": k,
          "pass_samples": samples}

