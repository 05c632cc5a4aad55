"""Samples of a problem as episodes: the loop that runs them through the engine, and the one-turn case.

A multi-turn problem set (one whose `environment()` is a class) samples `Episodes`. Each turn's seed is a pure
function of (run seed, problem, sample, turn) (the first turn: one request per problem whose n samples share
the prompt's prefill, sample j folded in); the episode's tokens after the prompt are the policy's turns and the
environment's observations (`jaxpod.problems.environments.Episode`), and `episode_group` makes a problem's n
episodes one `Group` with `from_policy` flags, so admission (`grpo.take`) and the trainer's rows
(`rl.batch.to_batch`) are the single-turn ones: the loss mask covers the policy's tokens only. An episode ends when
the environment says done, after `max_turns` turns, or when its next context would not fit the engine's
`max_prompt_len` (its last token is always the policy's). With `keep_kv` (the default) the engine keeps each
episode's KV between turns (`keep`): a turn prefills only the last sampled token and the observation, on the
same tokens as re-prefilling the whole context (what `keep_kv=False` does).

Tools that take time do not stall the others. The loop drives the Sampler round by round (`submit` / `step`): a turn
that finishes goes to its environment's `step` on a thread pool (`tool_workers`), and the engine goes on decoding
every other episode. When the engine is idle, the observations that have arrived (the first one waited for, the others
given JOIN_GRACE_S) are submitted together as their episodes' next turns (continuing their kept KV): one batch of
continuations, as a turn would be, so fast tools cost what a turn-by-turn loop costs, while an episode whose step is
still running joins at a later idle point instead of holding the others. Seeds fix the tokens, so the episodes are
those of a turn-by-turn loop, token for token, whatever order the tools finish in (`TurnByTurn(generate)` runs
a plain `generate` callable that way, one call per turn: test fakes and comparisons).

Every host gets identical observations: every host runs the same episodes (global mode) and steps its own copy of each
environment, which is deterministic (`environments`), so host h's observation of episode i is host 0's. What could
differ is when it arrives, and the engine's schedule must not: at an idle point with steps pending the leader
broadcasts the episodes whose observations it has (`runtime.broadcast_call`, one per idle point: about one per turn;
none while the engine decodes), and every host submits exactly those, in episode order, waiting for any it does not
have yet. So every host submits the same requests between the same rounds, and the schedule digest is compared once at
the end (`Sampler.check_schedule`, invariant 1).

A single-turn set samples `OneTurn`: one engine request per problem for its n samples, scored by the
reward plugins. Both have `groups(sampler, tokenizer, problems, n, seed)`; `samples_for` picks the one a
problem set needs, so the roller and the evaluator never ask which.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import types
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Callable, Sequence

from jaxpod import runtime

from jaxpod.problems.base import Problem
from jaxpod.problems.environments import Environment, Episode, answer_ids
from jaxpod.problems.rewards import Scorer, VerifiedProblems
from jaxpod.policy.rollout.groups import Group, make_group


def request_seed(seed: int, problem: Problem) -> int:
  """The engine seed of a problem's one-turn request (its n samples fold in their index)."""
  return (seed * 1_000_003 + problem.stream * 7_919 + problem.index) % (2 ** 31)


def turn_seed(seed: int, problem: Problem, sample: int, turn: int) -> int:
  """The engine seed of one turn of one episode: a pure function of the run seed, the problem's stream and
  index, the sample and the turn (not of batching, slots, hosts or restarts)."""
  return (seed * 1_000_003 + problem.stream * 7_919 + problem.index * 104_729 + sample * 15_485_863
          + turn * 32_452_843) % (2 ** 31)


# Observations join an idle engine together: one prefill or extend call per batch of continuations, as a turn
# would be (joining one at a time while the others decode costs a call per round: measured 1.8x slower kept, 3x
# re-prefilled, on 32 episodes of 6 turns); a step still pending after this grace joins at the next idle point.
JOIN_GRACE_S = 0.02


def run_episodes(engine, tokenizer, factory: Callable[[], Environment], problems: Sequence[Problem], n: int,
                 max_turns: int, seed: int, max_context: int | None = None,
                 keep_kv: bool = False, tool_workers: int = 1) -> list[list[Episode]]:
  """n episodes per problem. `engine` is driven round by round (`begin`, `submit(ids, seeds, n, keep) -> requests`,
  `step() -> finished completions`, `idle`, `drop_kept`, `check_schedule`): a global-mode `Sampler` (or one
  host's), or `TurnByTurn(generate)`. Each completion has .request, .sample, .sampled, .logprobs, .versions and
  .tokens without the stop token. The first turn is one request per problem with n samples (they share the
  prompt's prefill).

  The context of the next turn is the whole episode so far (prompt, turns, observations); with
  keep_kv the engine continues it from the previous turn's kept KV, else it recomputes it. An episode ends when
  the environment says done, after `max_turns` turns, or when its next context would exceed
  `max_context` tokens (the engine's prompt limit); only the first counts as `done`. Environment steps run
  on up to `tool_workers` threads."""
  _check_engine(engine)
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
  engine.begin()
  first = engine.submit(prompts, [turn_seed(seed, p, 0, 0) for p in problems], n=n, keep=keep_kv and max_turns > 1)
  owner = {h: g * n for g, h in enumerate(first)}  # request -> its first episode (episode = owner + sample)
  tools: dict[int, Future] = {}  # episode -> its environment's step of the turn just sampled
  with _pool(tool_workers) as pool:
    while tools or not engine.idle:
      for i in (_admitted(engine, tools) if tools else ()):  # sorted: every host submits in the same order
        e = episodes[i]
        if _observe(e, tokenizer, tools.pop(i).result(), max_turns, max_context):
          [h] = engine.submit([e.context()], [turn_seed(seed, e.problem, i % n, e.turns)],
                              keep=keep_kv and e.turns + 1 < max_turns)
          owner[h] = i
      for c in (engine.step() if not engine.idle else ()):
        i = owner[c.request] + c.sample
        episodes[i].add_turn(c.sampled, c.logprobs, c.versions)
        tools[i] = pool.submit(envs[i].step, tokenizer.decode(c.tokens))
  engine.drop_kept()  # every episode has ended: nothing continues
  engine.check_schedule()
  return [episodes[g * n:(g + 1) * n] for g in range(len(problems))]


def _observe(e: Episode, tokenizer, step: tuple[str, float, bool], max_turns: int, max_context: int | None) -> bool:
  """Record the environment's answer to the episode's last turn; whether the episode goes on (its observation
  appended) or ended (the last token of an episode is always the policy's)."""
  observation, reward, done = step
  e.reward += reward
  e.done = done
  ids = answer_ids(tokenizer, observation)
  if done or e.turns == max_turns or (max_context is not None and len(e.context()) + len(ids) > max_context):
    return False
  e.add_observation(ids)
  return True


def _admitted(engine, tools: dict[int, Future]) -> list[int]:
  """The episodes whose observation joins the engine now, the same on every host: every pending one for a
  turn-by-turn engine (after they all finish); else none while the engine decodes, and once it is idle those the
  leader has (waiting for the first, then up to JOIN_GRACE_S for the others), broadcast, each host waiting for any
  of them it does not have yet (`result()`)."""
  if isinstance(engine, TurnByTurn):
    wait(tools.values())
    return sorted(tools)
  if not engine.idle:
    return []
  if wait(tools.values(), timeout=JOIN_GRACE_S).done == set():
    wait(tools.values(), return_when=FIRST_COMPLETED)
    wait(tools.values(), timeout=JOIN_GRACE_S)
  return runtime.broadcast_call(lambda: sorted(i for i, f in tools.items() if f.done()), "episodes.observations")


def _check_engine(engine) -> None:
  """Refuse an engine whose hosts would not run one schedule (a replicated Sampler on several hosts), or a plain
  callable (wrap it: `TurnByTurn(generate)`), before any episode starts."""
  from jaxpod.sample import Sampler
  if isinstance(engine, Sampler):
    import jax
    if engine.mode != "global" and jax.process_count() > 1:
      raise ValueError(f"episodes need one schedule on every host: a Sampler in mode='global', not {engine.mode!r} "
                       f"over {jax.process_count()} hosts (or TurnByTurn(sampler.generate): a call per turn)")
  elif not isinstance(engine, TurnByTurn):
    raise TypeError(f"episodes: engine {type(engine).__name__} is neither a Sampler nor TurnByTurn(generate)")


class TurnByTurn:
  """A `generate(ids, seeds, n=, keep=)` callable as a round-by-round engine: a step is one call over everything
  submitted since the last (a call per (n, keep)), run to completion, so episodes advance a turn at a time."""

  def __init__(self, generate):
    self.generate, self.queue, self.requests = generate, [], 0

  def begin(self) -> None:
    """Nothing to reset: every call is a whole schedule."""

  def drop_kept(self) -> int:
    """Nothing is kept between calls that the callable does not manage itself."""
    return 0

  def check_schedule(self) -> None:
    """One call per turn: a Sampler behind it compares its own schedule per call."""

  @property
  def idle(self) -> bool:
    return not self.queue

  def submit(self, ids, seeds, n: int = 1, keep: bool = False) -> list[int]:
    handles = list(range(self.requests, self.requests + len(ids)))
    self.requests += len(ids)
    self.queue.append((n, keep, handles, list(ids), list(seeds)))
    return handles

  def step(self) -> list:
    calls, self.queue, done = self.queue, [], []
    for (n, keep), same in itertools.groupby(calls, key=lambda call: call[:2]):
      same = list(same)
      handles = [h for call in same for h in call[2]]
      outs = self.generate([x for call in same for x in call[3]], [s for call in same for s in call[4]], n=n,
                           keep=keep)
      done += [types.SimpleNamespace(request=h, sample=j, sampled=c.sampled, logprobs=c.logprobs,
                                     versions=c.versions, tokens=c.tokens)
               for k, h in enumerate(handles) for j, c in enumerate(outs[k * n:(k + 1) * n])]
    return done


@contextlib.contextmanager
def _pool(workers: int):
  """Where environment steps run: up to `workers` threads (one: inline, each step done when submitted). On the
  way out no step is waited for (they have all finished, unless the loop raised)."""
  pool = ThreadPoolExecutor(workers, thread_name_prefix="jaxpod-tool") if workers > 1 else _Inline()
  try:
    yield pool
  finally:
    pool.shutdown(wait=False, cancel_futures=True)


class _Inline:
  """An executor that runs each call at once, in the caller's thread."""

  def submit(self, fn, *args) -> Future:
    f = Future()
    try:
      f.set_result(fn(*args))
    except Exception as e:  # raised again by result(), where the loop reads it
      f.set_exception(e)
    return f

  def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
    pass


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

  def groups(self, sampler, tokenizer, problems: Sequence[Problem], n: int, seed: int) -> list[Group]:
    """Every problem's n samples as a scored Group, in order (one `sampler.generate(ids, seeds, n=n)` call)."""
    ids = [tokenizer.encode(p.prompt) for p in problems]
    outs = sampler.generate(ids, [request_seed(seed, p) for p in problems], n=n)
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
  tool_workers: int = 8  # threads that run environment steps (while the engine decodes the other episodes)

  def groups(self, sampler, tokenizer, problems: Sequence[Problem], n: int, seed: int) -> list[Group]:
    """Every problem's n episodes as a Group, in order (`run_episodes` driving `sampler`, then `episode_group`)."""
    return [episode_group(g) for g in run_episodes(sampler, tokenizer, self.factory, problems, n, self.max_turns,
                                                   seed, self.max_context, self.keep_kv, self.tool_workers)]


def samples_for(problems: VerifiedProblems, max_context: int, keep_kv: bool = True) -> OneTurn | Episodes:
  """How the samples of `problems` are made: episodes with fresh environments for a multi-turn set (turns and
  contexts limited by its max_turns and `max_context`, the engine's max_prompt_len; `keep_kv`: rollout.keep_kv),
  else one turn each."""
  factory = problems.problem_set.environment()
  if factory is None:
    return OneTurn(problems.scorer())
  return Episodes(factory, problems.problem_set.max_turns, max_context, keep_kv)
