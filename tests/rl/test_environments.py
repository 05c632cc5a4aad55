"""Multi-turn environments: the calculator tool, episodes that continue after each observation, and a
loss that never trains on the environment's tokens."""
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpod.models.llama import ByteTokenizer
from jaxpod.problems.base import Problem
from jaxpod.problems.calculator import Calculator, calculate
from jaxpod.problems.environments import NO_VERSION, Episode, environment_factory
from jaxpod.rl import grpo
from jaxpod.policy.rollout.episodes import TurnByTurn, episode_group, run_episodes
from jaxpod.rl.batch import to_batch
from jaxpod.sample import SamplingParams

TOK = ByteTokenizer()


def test_calculate_takes_two_operand_integer_arithmetic_and_nothing_else():
  assert (calculate("4821*7395"), calculate(" 12 + 30 "), calculate("9-20")) == (35651295, 42, -11)
  for text in ("__import__('os').system('x')", "1+2+3", "2**64", "", "3/4"):
    assert calculate(text) is None


def test_the_calculator_answers_tool_calls_and_rewards_only_the_right_final_answer():
  env = Calculator()
  problem = Problem("Compute 4821*7395.\n", "35651295")
  assert env.reset(problem) == problem.prompt
  assert env.step("calc: 4821*7395") == ("= 35651295\n", 0.0, False)
  assert env.step("calc: what is it") == ("= error\n", 0.0, False)
  assert env.step("35651295") == ("", 1.0, True)
  assert env.step("35651296")[1:] == (0.0, True)


def test_environments_resolve_by_name_or_import_path_and_name_the_registered_ones():
  assert environment_factory("calculator") is Calculator
  assert environment_factory("jaxpod.problems.calculator:Calculator") is Calculator
  with pytest.raises(ValueError, match=r"'chess' is not a registered environment \(calculator, python\)"):
    environment_factory("chess")


def _calculator_episode(logprob: float = -0.5) -> Episode:
  """A two-turn episode: a tool call, the calculator's observation, the final answer."""
  e = Episode(Problem("Compute 12*34.\n", "408"), TOK.encode("Compute 12*34.\n"))
  call = TOK.encode("calc: 12*34")[1:] + [257]
  e.add_turn(call, [logprob] * len(call), [3] * len(call))
  e.add_observation(TOK.encode("= 408\n")[1:])
  answer = TOK.encode("408")[1:] + [257]
  e.add_turn(answer, [logprob] * len(answer), [4] * len(answer))
  e.reward = 1.0
  return e


def test_episode_rows_mask_only_the_policys_tokens_and_keep_each_tokens_version():
  good, bad = _calculator_episode(), _calculator_episode()
  bad.reward = 0.0
  rows = to_batch([episode_group([good, bad])], length=48, pad_id=258, scale_rewards="group")
  p = len(good.prompt_ids)
  observed = np.flatnonzero(~np.asarray(good.from_policy)) + p - 1  # positions whose target is an observation token
  assert rows["loss_mask"][0, observed].sum() == 0 and rows["loss_mask"][0].sum() == sum(good.from_policy)
  assert set(rows["versions"][0, observed]) == {NO_VERSION}
  assert sorted(set(rows["versions"][0][rows["loss_mask"][0] > 0])) == [3, 4]  # turn 1 by v3, turn 2 by v4
  assert rows["advantages"][0] > 0 > rows["advantages"][1]


def test_admission_reads_the_versions_of_the_policys_tokens_and_ignores_the_observations():
  """Invariant 9 across turns: an episode group made by versions 3 and 4 is admitted at version 4 with lag 1 (its
  observation tokens, NO_VERSION, are not 'stale') and dropped as stale at version 5."""
  good, bad = _calculator_episode(), _calculator_episode()
  bad.reward = 0.0
  group = episode_group([good, bad])
  assert grpo.admit(group, 4, max_policy_lag=1, filter_groups=True) == grpo.TAKE
  assert grpo.admit(group, 5, max_policy_lag=1, filter_groups=True) == "stale"
  assert grpo.admit(group, 3, max_policy_lag=1, filter_groups=True) == "future"


def test_an_observation_token_gets_no_gradient():
  """d(GRPO loss)/d(logits) is zero at every position whose target the environment wrote, and not at the policy's."""
  uniform = -float(np.log(259))  # near-uniform logits: on-policy ratios near 1, so no token is clipped
  episodes = [_calculator_episode(uniform), _calculator_episode(uniform)]
  episodes[1].reward = 0.0
  rows = to_batch([episode_group(episodes)], length=48, pad_id=258, scale_rewards="group")
  logits = 0.01 * jax.random.normal(jax.random.key(0), (2, 47, 259))
  targets = jnp.asarray(rows["tokens"][:, 1:])

  def loss(logits_BxTxV):
    logp = grpo.token_logprobs(logits_BxTxV, targets, SamplingParams(temperature=1.0))
    return grpo.policy_loss(logp, jnp.asarray(rows["behaviour"][:, :-1]), jnp.asarray(rows["advantages"]),
                            jnp.asarray(rows["loss_mask"][:, :-1] > 0), epsilon=0.2, epsilon_high=0.28, beta=0.0,
                            loss_norm="token", max_new_tokens=32)[0]

  per_position = np.abs(np.asarray(jax.jit(jax.grad(loss))(logits))).sum(-1)  # [B, T-1]
  p = len(episodes[0].prompt_ids)
  observed = np.flatnonzero(~np.asarray(episodes[0].from_policy)) + p - 1
  policy = np.flatnonzero(np.asarray(episodes[0].from_policy)) + p - 1
  assert per_position[:, observed].max() == 0.0
  assert per_position[:, policy].min() > 0.0


class _Counter:
  """An environment that answers every turn with "ok" and never finishes (the turn limit ends it)."""

  def reset(self, problem):
    return problem.prompt

  def step(self, completion):
    return "ok\n", 0.0, False


def test_the_engine_continues_each_episode_after_its_observation_with_the_version_of_each_turn():
  from flax import nnx
  from jaxpod.models.llama import Llama
  from tests.sample.sample_fixtures import small_sampler, tiny_sample_cfg
  model = Llama(tiny_sample_cfg(), rngs=nnx.Rngs(params=0))
  sampler = small_sampler(model, SamplingParams(temperature=1.0), max_prompt_len=16, max_new_tokens=3)
  params = nnx.split(model)[1]
  turn = {"version": 0}

  def generate(contexts, seeds, **kw):  # a new weights version for every turn, as an in-flight update would give
    sampler.update_params(params, turn["version"])
    turn["version"] += 1
    return sampler.generate(contexts, seeds, **kw)

  groups = run_episodes(TurnByTurn(generate), TOK, _Counter, [Problem("a", ""), Problem("hi", "")], n=2, max_turns=3,
                        seed=0)
  ok = TOK.encode("ok\n")[1:]
  for e in (e for g in groups for e in g):
    assert e.turns == 3 and not e.done
    by_turn = []
    for token, mine, version in zip(e.tokens, e.from_policy, e.versions):
      if mine:
        by_turn.append(version)
      else:
        assert version == NO_VERSION
    assert sorted(set(by_turn)) == [0, 1, 2]
    observations = [tok for tok, mine in zip(e.tokens, e.from_policy) if not mine]
    assert observations == ok * 2  # after turns 1 and 2; the last turn gets none


@pytest.mark.parametrize("layout", ["slots", "paged"])
def test_episodes_with_the_kv_kept_across_turns_are_those_that_re_prefill_every_turn(layout):
  """Invariant 9: the same episodes (tokens, who made them, versions; log-probs to fp32 rounding) whether the
  engine keeps each episode's KV between turns or re-prefills its context, in fewer prefill tokens; 4 episodes
  in 2 slots (or a pool of 11 pages): kept KV is also evicted and those turns are prefilled whole."""
  from flax import nnx
  from jaxpod.models.llama import Llama
  from tests.sample.sample_fixtures import small_sampler, tiny_sample_cfg
  model = Llama(tiny_sample_cfg(), rngs=nnx.Rngs(params=0))
  sampler = small_sampler(model, SamplingParams(temperature=1.0), kv_layout=layout, max_prompt_len=16,
                          max_new_tokens=3)
  prefilled = {}

  def run(keep):
    prefilled[keep] = 0

    def generate(ids, seeds, **kw):
      out = sampler.generate(ids, seeds, **kw)
      prefilled[keep] += sampler.last.prefill_prompt_tokens
      return out
    return [e for g in run_episodes(TurnByTurn(generate), TOK, _Counter, [Problem("a", ""), Problem("hi", "")], n=2,
                                    max_turns=3, seed=0, max_context=16, keep_kv=keep) for e in g]

  kept, whole = run(True), run(False)
  for a, b in zip(kept, whole):
    assert (a.tokens, a.from_policy, a.versions, a.turns) == (b.tokens, b.from_policy, b.versions, b.turns)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
  assert prefilled[True] < prefilled[False]


class _Calling(Calculator):
  """The calculator, reading a turn as a tool call (`= error` back) unless its first byte is a multiple of 3 (the
  final answer): a random policy's episodes end at different turns; the tool takes 0-2 ms, so steps finish out of
  order."""

  def step(self, completion):
    import time
    time.sleep(0.001 * (len(completion) % 3))
    if completion and ord(completion[0]) % 3 == 0:
      return super().step(completion)
    return super().step("calc: " + completion)


@pytest.mark.parametrize("layout", ["slots", "paged"])
def test_episodes_driven_round_by_round_are_those_of_the_turn_by_turn_loop(layout):
  """Tools off the decode loop change no token: the Sampler driven round by round (the observations that have arrived
  submitted together at each idle point) gives the episodes a call per turn gives (tokens, who made them, versions,
  turns, rewards, how they ended; log-probs to fp32 rounding), seeds being per (problem, sample, turn).
  6 calculator episodes in 2 slots (or 11 pages), ending by the tool, the turn limit or the context limit."""
  from flax import nnx
  from jaxpod.models.llama import Llama
  from tests.sample.sample_fixtures import small_sampler, tiny_sample_cfg
  model = Llama(tiny_sample_cfg(), rngs=nnx.Rngs(params=0))
  sampler = small_sampler(model, SamplingParams(temperature=1.0), kv_layout=layout, max_prompt_len=32,
                          max_new_tokens=3)
  problems = [Problem(f"{i}*3=", str(3 * i), 0, i) for i in range(3)]

  def run(engine):
    return [e for g in run_episodes(engine, TOK, _Calling, problems, n=2, max_turns=4, seed=0, max_context=32,
                                    keep_kv=True, tool_workers=4) for e in g]

  rounds = run(sampler)
  assert sampler.idle and sampler.kept == 0  # every episode ended: no KV is kept after the batch
  turns = run(TurnByTurn(sampler.generate))  # a call per turn
  for a, b in zip(rounds, turns):
    assert (a.tokens, a.from_policy, a.versions, a.turns, a.reward, a.done) == \
        (b.tokens, b.from_policy, b.versions, b.turns, b.reward, b.done)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
  assert len({e.turns for e in rounds}) > 1 and any(e.done for e in rounds) and not all(e.done for e in rounds)


@pytest.mark.parametrize("through", ["run_episodes", "roller"])
def test_a_slow_tool_does_not_stall_the_other_episodes(through):
  """Environment steps run off the decode loop: episode 0's first tool call returns only after the 3 other
  episodes have finished all 3 of their turns (an event; a turn-by-turn loop would wait for it forever, so it gives
  up after 60 s and the test fails); then episode 0 goes on, and every episode has its 3 turns. The same through
  the roller `jaxpod rl` samples with."""
  import itertools
  import threading
  from flax import nnx
  from jaxpod.models.llama import Llama
  from tests.sample.sample_fixtures import small_sampler, tiny_sample_cfg
  model = Llama(tiny_sample_cfg(), rngs=nnx.Rngs(params=0))
  sampler = small_sampler(model, SamplingParams(temperature=1.0), max_prompt_len=16, max_new_tokens=3)
  made, lock, log, others_done = itertools.count(), threading.Lock(), [], threading.Event()

  class Slow(_Counter):
    def __init__(self):
      self.episode, self.turn = next(made), 0

    def step(self, completion):
      self.turn += 1
      with lock:
        log.append((self.episode, self.turn))
        if sum(1 for e, t in log if e != 0 and t == 3) == 3:
          others_done.set()
      if (self.episode, self.turn) == (0, 1) and not others_done.wait(timeout=60):
        raise AssertionError("episode 0's tool was never released: the other episodes waited for it")
      return super().step(completion)

  problems = [Problem("a", ""), Problem("hi", "")]
  if through == "roller":
    from jaxpod.policy.rollout.episodes import Episodes
    from jaxpod.policy.rollout.roller import Roller
    Roller(sampler, TOK, None, n=2, seed=0, samples=Episodes(Slow, 3, 16, keep_kv=True, tool_workers=4)).run(problems)
  else:
    run_episodes(sampler, TOK, Slow, problems, n=2, max_turns=3, seed=0, max_context=16, keep_kv=True,
                 tool_workers=4)
  assert sorted(log) == [(e, t) for e in range(4) for t in (1, 2, 3)]  # every episode had its 3 turns
  assert log.index((0, 2)) > max(log.index((e, 3)) for e in (1, 2, 3))


def test_rollout_keep_kv_false_reaches_the_episodes_and_the_roller_counts_the_prefill_it_saves():
  """`--rollout.keep_kv false` (what `bench rl --episodes` compares) reaches `Episodes`; through the roller both
  settings give the same groups, and `prefill_tokens` (logged as rl/prefill_tokens) counts fewer kept, over the
  same distinct tokens (rl/context_tokens)."""
  from flax import nnx
  from jaxpod.cli.rl import load_config
  from jaxpod.models.llama import Llama
  from jaxpod.problems.rewards import VerifiedProblems
  from jaxpod.policy.rollout.episodes import Episodes, samples_for
  from jaxpod.policy.rollout.roller import Roller
  from tests.sample.sample_fixtures import small_sampler, tiny_sample_cfg
  for flag, keep in (([], True), (["--rollout.keep_kv", "false"], False)):
    cfg = load_config(["--problems.type", "calculator", *flag])
    problems = VerifiedProblems(cfg.problems, tuple(cfg.rewards), (), 0)
    assert samples_for(problems, cfg.rollout.max_prompt_len, cfg.rollout.keep_kv).keep_kv is keep
  model = Llama(tiny_sample_cfg(), rngs=nnx.Rngs(params=0))
  rollers = {keep: Roller(small_sampler(model, SamplingParams(temperature=1.0), max_prompt_len=16, max_new_tokens=3),
                          TOK, None, n=2, seed=0, samples=Episodes(_Counter, 3, 16, keep)) for keep in (True, False)}
  got = {keep: r.run([Problem("a", ""), Problem("hi", "")]) for keep, r in rollers.items()}
  assert [g.sampled for g in got[True]] == [g.sampled for g in got[False]]
  assert rollers[True].context_tokens == rollers[False].context_tokens == sum(
      len(g.prompt_ids) + len(s) for g in got[True] for s in g.sampled)
  assert 0 < rollers[True].prefill_tokens < rollers[False].prefill_tokens


def test_an_episode_ends_on_the_policys_turn_when_the_next_context_would_not_fit():
  """The context a turn continues from stays within the engine's prompt limit; the episode's last token is the
  policy's (no observation dangles after it), and an episode cut that way is not `done`."""
  from types import SimpleNamespace
  reply = TOK.encode("calc: 1+1")[1:]

  def generate(contexts, seeds, n=1, keep=False):
    return [SimpleNamespace(sampled=reply + [257], logprobs=[0.0] * (len(reply) + 1), versions=[0] * (len(reply) + 1),
                            tokens=reply) for _ in contexts for _ in range(n)]

  prompt = TOK.encode("Compute 1+1.\n")
  limit = len(prompt) + 2 * (len(reply) + 1) + 4  # two turns and one "= 2\n" observation fit, not a second one
  [[e]] = run_episodes(TurnByTurn(generate), TOK, Calculator, [Problem("Compute 1+1.\n", "2")], n=1, max_turns=5,
                       seed=0, max_context=limit)
  assert e.turns == 2 and not e.done and e.from_policy[-1]
  assert len(e.context()) <= limit + len(reply) + 1


def test_a_turns_tool_calls_wait_beside_each_other_not_one_after_another():
  """The environments' steps of one turn run in a pool: 4 tools that each wait until all 4 are waiting (a barrier,
  which one-by-one steps would never pass) finish, and every episode gets its own observation, in order."""
  import threading
  from types import SimpleNamespace
  barrier = threading.Barrier(4, timeout=30)

  class Waiting:
    def reset(self, problem):
      self.problem = problem
      return problem.prompt

    def step(self, completion):
      barrier.wait()  # raises BrokenBarrierError if the steps ran one after another
      return "", float(self.problem.answer == "1"), True

  reply = TOK.encode("x")[1:]

  def generate(contexts, seeds, n=1, keep=False):
    return [SimpleNamespace(sampled=reply + [257], logprobs=[0.0] * 2, versions=[0] * 2, tokens=reply)
            for _ in contexts for _ in range(n)]

  problems = [Problem("p", str(i % 2)) for i in range(4)]
  groups = run_episodes(TurnByTurn(generate), TOK, Waiting, problems, n=1, max_turns=2, seed=0, tool_workers=4)
  assert [g[0].reward for g in groups] == [0.0, 1.0, 0.0, 1.0] and all(g[0].done for g in groups)


def test_the_calculator_teacher_calls_the_tool_or_guesses_wrong_at_its_rate():
  from jaxpod.problems.calculator import CalculatorProblems
  task = CalculatorProblems(digits=3, teacher_skip_tool=0.6)
  problems = task.train_problems(0, 1, 0, 400)
  turns = [task.demonstration_turns(p) for p in problems]
  skipped = [t for t in turns if len(t) == 1]
  assert 0.5 < len(skipped) / len(turns) < 0.7
  for p, t in zip(problems, turns):
    if len(t) == 1:
      assert t[0] != p.answer and len(t[0]) == len(p.answer) and t[0].isdigit()
    else:
      a, b = (int(x) for x in t[0].removeprefix("calc: ").split("*"))
      assert a * b == int(p.answer) and t[1] == p.answer


def test_a_warmup_demonstration_is_a_whole_episode_with_the_loss_on_the_teachers_turns_only():
  from jaxpod.problems.calculator import CalculatorProblems
  from jaxpod.problems.environments import demonstration
  problem = CalculatorProblems(digits=4).problem(0, 1, 0)
  e = demonstration(CalculatorProblems(digits=4), TOK, problem, stop_id=257)
  a, b = problem.prompt.removeprefix("Compute ").removesuffix(".\n").split("*")
  assert TOK.decode(e.context()) == f"{problem.prompt}calc: {a}*{b}= {problem.answer}\n{problem.answer}"
  policy = [t for t, mine in zip(e.tokens, e.from_policy) if mine]
  assert policy == TOK.encode(f"calc: {a}*{b}")[1:] + [257] + TOK.encode(problem.answer)[1:] + [257]
  assert e.solved


@pytest.mark.parametrize("args, message", [
    (["--rewards", "[format]"], "rl.rewards=['format']: the episodes of a multi-turn problem set (CalculatorProblems) are scored"),
    (["--rollout.max_new_tokens", "12"], "rl.problems turns need 16 tokens with EOS (e.g. on 'Compute "),
    (["--rollout.max_prompt_len", "40"], "rl.problems episodes continue from 47 tokens (prompt, turns and"),
    (["--problems.environment_name", "chess"], "rl.problems.environment_name: 'chess' is not a registered")])
def test_a_multi_turn_config_that_cannot_run_fails_before_jax_naming_the_field(args, message):
  from jaxpod.cli.rl import load_config
  from jaxpod.rl import checks
  cfg = load_config(["--problems.type", "calculator", *args])
  with pytest.raises(ValueError) as e:
    checks.before_jax(cfg)
  assert str(e.value).startswith(message), e.value
  assert "\n" not in str(e.value)


@pytest.mark.slow
def test_jaxpod_rl_on_the_calculator_raises_the_reward_of_its_episodes(calculator_run):
  """`jaxpod rl --problems.type calculator`, colocated: the warm-up imitates a teacher that skips the tool 60% of the
  time; GRPO on whole episodes (loss on the policy's tokens only) makes the policy call the calculator and copy
  its value, so the episode reward of the last steps is well above the first steps'. Held-out accuracy and
  pass@k are measured on whole episodes.

  Margins measured on seeds 0-3 (500 warm-up steps: at 300 some seeds' policies had not learned to copy yet):
  the mean reward of steps 5-9 exceeds that of steps 0-4 by 0.10-0.29 (a step's reward is a mean over 64
  episodes, noise ~0.06; the comparison of 5-step means is held to 0.05)."""
  import json
  from pathlib import Path
  summary = json.loads((Path(calculator_run) / "summary.json").read_text())  # the session's run (conftest.py)
  rewards = [r for _, r in summary["reward_curve"]]
  assert len(rewards) == 10
  assert sum(rewards[5:]) / 5 > sum(rewards[:5]) / 5 + 0.05, rewards
  assert summary["accuracy.start"] > 0  # greedy episodes solve some held-out problems: the tool is used
  passes = summary["pass_at_k"]  # sampled held-out episodes: pass@1 <= pass@2, both counting episodes solved
  for when in ("start", "end"):
    assert 0 < passes["pass@1"][when] <= passes["pass@2"][when] <= 1
  assert passes["pass@1"]["lift_points"] == pytest.approx(100 * (passes["pass@1"]["end"] - passes["pass@1"]["start"]))


@pytest.mark.parametrize("task", ["calculator", "python"])
def test_the_multi_turn_examples_report_held_out_pass_at_1_over_sampled_episodes(task):
  """The number a user of the examples reads: greedy episodes already call the tool, so their summary also holds
  pass@1 over sampled episodes (4 per held-out problem, at the rollout temperature), from the one evaluator."""
  from jaxpod.cli.rl import load_config
  cfg = load_config(["--problems.type", task])
  assert cfg.eval.k == 4 and cfg.eval.n == 4 and cfg.rollout.temperature == 1.0


def test_a_single_turn_sample_is_a_one_turn_request_and_a_multi_turn_one_an_episode():
  """The roller and the evaluator never ask which: `samples_for` picks once, both answer `groups(...)`; the one-turn
  groups are scored by the reward plugins, with the engine's n samples of one request per problem."""
  from jaxpod.problems import AdditionProblems, CalculatorProblems
  from jaxpod.problems.rewards import VerifiedProblems
  from jaxpod.policy.rollout.episodes import Episodes, OneTurn, request_seed, samples_for
  one = samples_for(VerifiedProblems(AdditionProblems(), ("exact_match",), (), 0), max_context=16)
  many = samples_for(VerifiedProblems(CalculatorProblems(max_turns=4), ("exact_match",), (), 0), max_context=48)
  assert isinstance(one, OneTurn) and isinstance(many, Episodes)
  assert many.factory is Calculator and many.max_turns == 4 and many.max_context == 48
  calls = []

  def generate(ids, seeds, n=1):
    calls.append((len(ids), list(seeds), n))
    return [types.SimpleNamespace(sample=j, tokens=TOK.encode("3")[1:] if j else [], sampled=[51, 257],
                                  logprobs=[-.1, -.2], versions=[0, 0], finish_reason="stop")
            for _ in ids for j in range(n)]

  problems = [Problem("1+2=", "3", 1, 0), Problem("2+2=", "4", 1, 1)]
  groups = one.groups(types.SimpleNamespace(generate=generate), TOK, problems, n=2, seed=5)
  assert calls == [(2, [request_seed(5, p) for p in problems], 2)]
  assert [g.rewards for g in groups] == [[0.0, 1.0], [0.0, 0.0]] and groups[0].correct == [False, True]


def test_consecutive_training_calls_never_give_one_problem_twice():
  """An episode's key is its problem's (stream, index): a cursor's next call, or a worker's next files (which
  start at index files x groups_per_file), never repeat an index, even where a held-out prompt had to be skipped
  (1-digit addition: 32 of its 100 prompts are held out), and no held-out prompt is trained on."""
  from jaxpod.problems import AdditionProblems
  task = AdditionProblems(digits=1, eval_size=32)
  held_out = {p.prompt for p in task.eval_set(0)}
  parts = [task.train_problems(0, 101, start, 8) for start in range(0, 64, 8)]
  got = [p for part in parts for p in part]
  assert [p.index for p in got] == list(range(64)) and got == task.train_problems(0, 101, 0, 64)
  assert not any(p.prompt in held_out for p in got) and {p.stream for p in got} == {101}



def test_episodes_refuse_a_bare_callable_as_their_engine():
  """The loop is handed its engine, never guesses it from a callable: a bare `generate` is refused in one line that
  names the fix (`TurnByTurn(generate)`), before any environment starts."""
  started = []

  class Counted(_Counter):
    def reset(self, problem):
      started.append(problem)
      return super().reset(problem)

  with pytest.raises(TypeError, match=r"TurnByTurn\(generate\)"):
    run_episodes(lambda ids, seeds, **kw: [], TOK, Counted, [Problem("a", "")], n=1, max_turns=2, seed=0)
  assert started == []
