"""Multi-turn environments: the calculator tool, episodes that continue after each observation, and a
loss that never trains on the environment's tokens."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpod.models.llama import ByteTokenizer
from jaxpod.rl import grpo
from jaxpod.rl.environments import (NO_VERSION, Calculator, Episode, calculate, environment_factory, episode_rows,
                                    run_episodes)
from jaxpod.rl.tasks import Problem
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
  assert environment_factory("jaxpod.rl.environments:Calculator") is Calculator
  with pytest.raises(ValueError, match=r"'chess' is not a registered environment \(calculator\)"):
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
  rows = episode_rows([[good, bad]], length=48, pad_id=258, scale_rewards="group")
  p = len(good.prompt_ids)
  observed = np.flatnonzero(~np.asarray(good.from_policy)) + p - 1  # positions whose target is an observation token
  assert rows["loss_mask"][0, observed].sum() == 0 and rows["loss_mask"][0].sum() == sum(good.from_policy)
  assert set(rows["versions"][0, observed]) == {NO_VERSION}
  assert sorted(set(rows["versions"][0][rows["loss_mask"][0] > 0])) == [3, 4]  # turn 1 by v3, turn 2 by v4
  assert rows["advantages"][0] > 0 > rows["advantages"][1]


def test_an_observation_token_gets_no_gradient():
  """d(GRPO loss)/d(logits) is zero at every position whose target the environment wrote, and not at the policy's."""
  uniform = -float(np.log(259))  # near-uniform logits: on-policy ratios near 1, so no token is clipped
  episodes = [_calculator_episode(uniform), _calculator_episode(uniform)]
  episodes[1].reward = 0.0
  rows = episode_rows([episodes], length=48, pad_id=258, scale_rewards="group")
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

  def generate(contexts, seeds):  # a new weights version for every turn, as an in-flight update would give
    sampler.update_params(params, turn["version"])
    turn["version"] += 1
    return sampler.generate(contexts, seeds)

  groups = run_episodes(generate, TOK, _Counter, [Problem("a", ""), Problem("hi", "")], n=2, max_turns=3, seed=0)
  ok = TOK.encode("ok\n")[1:]
  for e in (e for g in groups for e in g):
    assert e.turns == 3 and not e.done
    by_turn, t = [], 0
    for token, mine, version in zip(e.tokens, e.from_policy, e.versions):
      if mine:
        by_turn.append(version)
      else:
        assert version == NO_VERSION
    assert sorted(set(by_turn)) == [0, 1, 2]
    observations = [tok for tok, mine in zip(e.tokens, e.from_policy) if not mine]
    assert observations == ok * 2  # after turns 1 and 2; the last turn gets none
