"""Samples of a problem as episodes: the loop that runs them through the engine, and the one-turn case.

A multi-turn problem set (one whose `environment()` is a class) samples `Episodes`: one engine call per
turn over every open episode, each turn's seed a pure function of (run seed, problem, sample, turn)
(the first turn: one request per problem whose n samples share the prompt's prefill, sample j folded in);
the episode's tokens after the prompt are the policy's turns and the environment's observations
(`jaxpod.problems.environments.Episode`), and `episode_group` makes a problem's n episodes one `Group`
with `from_policy` flags, so admission (`grpo.take`) and the trainer's rows (`groups.to_batch`) are the
single-turn ones: the loss mask covers the policy's tokens only. An episode ends when the environment
says done, after `max_turns` turns, or when its next context would not fit the engine's `max_prompt_len`
(its last token is always the policy's). With `keep_kv` (the default) the engine keeps each episode's KV
between turns (`Sampler.generate(..., keep=True)`): a turn prefills only the last sampled token and the
observation, on the same tokens as re-prefilling the whole context (what `keep_kv=False` does). The
environments' steps of a turn run in a thread pool (`tool_workers`): a tool that waits (a sandboxed program,
a request) waits beside the others instead of after them; each episode's observation depends on its own
environment only, so the order they finish in changes nothing (every host still gets the same observations).

A single-turn set samples `OneTurn`: one engine request per problem for its n samples, scored by the
reward plugins. Both have `groups(generate, tokenizer, problems, n, seed)`; `samples_for` picks the one a
problem set needs, so the roller and the evaluator never ask which.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from jaxpod.problems.base import Problem
from jaxpod.problems.environments import Environment, Episode, answer_ids
from jaxpod.problems.rewards import Scorer, VerifiedProblems
from jaxpod.rl.rollout.groups import Group, make_group


def request_seed(seed: int, problem: Problem) -> int:
  """The engine seed of a problem's one-turn request (its n samples fold in their index)."""
  return (seed * 1_000_003 + problem.stream * 7_919 + problem.index) % (2 ** 31)


def turn_seed(seed: int, problem: Problem, sample: int, turn: int) -> int:
  """The engine seed of one turn of one episode: a pure function of the run seed, the problem's stream and
  index, the sample and the turn (not of batching, slots, hosts or restarts)."""
  return (seed * 1_000_003 + problem.stream * 7_919 + problem.index * 104_729 + sample * 15_485_863
          + turn * 32_452_843) % (2 ** 31)


def run_episodes(generate, tokenizer, factory: Callable[[], Environment], problems: Sequence[Problem], n: int,
                 max_turns: int, seed: int, max_context: int | None = None,
                 keep_kv: bool = False, tool_workers: int = 1) -> list[list[Episode]]:
  """n episodes per problem, turn by turn: `generate(contexts, seeds, n=1, keep=keep_kv) -> completions` samples
  one turn of every open episode (each completion has .sampled, .logprobs, .versions and .tokens without the stop
  token); the first turn is one request per problem with n samples (they share the prompt's prefill).

  The context of the next turn is the whole episode so far (prompt, turns, observations); with
  keep_kv the engine continues it from the previous turn's kept KV, else it recomputes it. An episode ends when
  the environment says done, after `max_turns` turns, or when its next context would exceed
  `max_context` tokens (the engine's prompt limit); only the first counts as `done`. A turn's environment steps run
  on up to `tool_workers` threads."""
  episodes, envs = [], []
  for p in problems:
    for _ in range(n):
      env = factory()
      envs.append(env)
      episodes.append(Episode(p, tokenizer.encode(env.reset(p))))
  prompts = [episodes[g * n].prompt_ids for g in range(len(problems))]
  for g, p in enumerate(problems):
    if any(e.prompt_ids != prompts[g] for e in episodes[g * n:(g + 1) * n]):
      raise ValueError(f"environment {type(envs[g * n]).__name__}: reset() gave the {n} episodes of problem "
                       f"{p.index} different first messages; it must depend on the problem only")
  open_ = list(range(len(episodes)))
  for turn in range(max_turns):
    if not open_:
      break
    if turn == 0:  # the prompt prefilled once per problem for its n episodes
      outs = generate(prompts, [turn_seed(seed, p, 0, 0) for p in problems], n=n, keep=keep_kv)
    else:
      seeds = [turn_seed(seed, episodes[i].problem, i % n, turn) for i in open_]
      outs = generate([episodes[i].context() for i in open_], seeds, keep=keep_kv)
    steps = _step_all([envs[i] for i in open_], [tokenizer.decode(c.tokens) for c in outs], tool_workers)
    still = []
    for i, c, (observation, reward, done) in zip(open_, outs, steps):
      e = episodes[i]
      e.add_turn(c.sampled, c.logprobs, c.versions)
      e.reward += reward
      e.done = done
      ids = answer_ids(tokenizer, observation)
      if done or turn + 1 == max_turns or (max_context is not None and len(e.context()) + len(ids) > max_context):
        continue  # ended: the last token of an episode is always the policy's
      e.add_observation(ids)
      still.append(i)
    open_ = still
  return [episodes[g * n:(g + 1) * n] for g in range(len(problems))]


def _step_all(envs: Sequence[Environment], texts: Sequence[str], workers: int) -> list[tuple[str, float, bool]]:
  """`env.step(text)` of every open episode, in order, on up to `workers` threads (one: inline)."""
  if workers <= 1 or len(envs) <= 1:
    return [env.step(text) for env, text in zip(envs, texts)]
  from concurrent.futures import ThreadPoolExecutor
  with ThreadPoolExecutor(min(workers, len(envs)), thread_name_prefix="jaxpod-tool") as pool:
    return list(pool.map(lambda pair: pair[0].step(pair[1]), zip(envs, texts)))


def episode_group(episodes: Sequence[Episode]) -> Group:
  """One problem's n episodes as a `groups.Group` (what admission and the trainer's batch take): every token
  after the prompt, `from_policy` marking the policy's; the reward is the episode's, correct means solved."""
  return Group(problem=episodes[0].problem, prompt_ids=list(episodes[0].prompt_ids),
               sampled=[list(e.tokens) for e in episodes], logprobs=[list(e.logprobs) for e in episodes],
               versions=[list(e.versions) for e in episodes], finished=[e.done for e in episodes],
               rewards=[e.reward for e in episodes], correct=[e.solved for e in episodes],
               from_policy=[list(e.from_policy) for e in episodes])


@dataclasses.dataclass(frozen=True)
class OneTurn:
  """How a single-turn set's samples are made: one request per problem, n samples, scored by the reward plugins."""

  scorer: Scorer  # the configured rewards and the set's verifier

  def groups(self, generate, tokenizer, problems: Sequence[Problem], n: int, seed: int) -> list[Group]:
    """Every problem's n samples as a scored Group, in order (`generate(ids, seeds, n=n)`: the engine's call)."""
    ids = [tokenizer.encode(p.prompt) for p in problems]
    outs = generate(ids, [request_seed(seed, p) for p in problems], n=n)
    return [group(self.scorer, tokenizer, p, ids[i], outs[i * n:(i + 1) * n]) for i, p in enumerate(problems)]


def group(scorer: Scorer, tokenizer, problem: Problem, prompt_ids: Sequence[int], completions) -> Group:
  """A scored Group from the engine's n completions of one prompt."""
  texts = [tokenizer.decode(c.tokens) for c in completions]
  return make_group(problem, prompt_ids, completions, texts, scorer)


@dataclasses.dataclass(frozen=True)
class Episodes:
  """How a multi-turn set's samples are made: episodes with fresh environments, turn and context limits."""

  factory: Callable[[], Environment]  # a fresh environment per episode
  max_turns: int  # policy turns per episode at most
  max_context: int  # tokens a turn may continue from (the engine's max_prompt_len)
  keep_kv: bool = True  # the engine keeps each episode's KV between turns (False: every turn re-prefills it all)
  tool_workers: int = 8  # threads that run a turn's environment steps (a slow tool waits beside the others)

  def groups(self, generate, tokenizer, problems: Sequence[Problem], n: int, seed: int) -> list[Group]:
    """Every problem's n episodes as a Group, in order (`run_episodes`, then `episode_group`)."""
    return [episode_group(g) for g in run_episodes(generate, tokenizer, self.factory, problems, n, self.max_turns,
                                                   seed, self.max_context, self.keep_kv, self.tool_workers)]


def samples_for(problems: VerifiedProblems, max_context: int, keep_kv: bool = True) -> OneTurn | Episodes:
  """How the samples of `problems` are made: episodes with fresh environments for a multi-turn set (turns and
  contexts limited by its max_turns and `max_context`, the engine's max_prompt_len; `keep_kv`: rollout.keep_kv),
  else one turn each."""
  factory = problems.problem_set.environment()
  if factory is None:
    return OneTurn(problems.scorer())
  return Episodes(factory, problems.problem_set.max_turns, max_context, keep_kv)
