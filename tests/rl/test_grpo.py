"""GRPO advantages and loss against a small NumPy implementation written from the formulas, loop by loop."""
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpod.rl import grpo
from jaxpod.sample import SamplingParams
from jaxpod.sample.tokens import LOGPROB_FLOOR


def np_advantages(rewards, scale, eps=1e-4):
  out = np.zeros_like(rewards, np.float64)
  every = rewards.reshape(-1)
  batch_std = np.sqrt(np.sum((every - every.mean()) ** 2) / (every.size - 1))
  for g, group in enumerate(rewards):
    mean = sum(group) / len(group)
    std = np.sqrt(sum((x - mean) ** 2 for x in group) / (len(group) - 1))
    for i, x in enumerate(group):
      out[g, i] = (x - mean) / {"group": std + eps, "batch": batch_std + eps, "none": 1.0}[scale]
  return out


def np_loss(logp, behaviour, adv, mask, ref, eps_low, eps_high, beta, norm, max_new):
  b, t = logp.shape
  per_row, total, count = [], 0.0, 0
  for i in range(b):
    row_sum, row_count = 0.0, 0
    for j in range(t):
      if not mask[i, j]:
        continue
      rho = np.exp(logp[i, j] - behaviour[i, j])
      value = -min(rho * adv[i], min(max(rho, 1 - eps_low), 1 + eps_high) * adv[i])
      if beta:
        d = ref[i, j] - logp[i, j]
        value += beta * (np.exp(d) - d - 1)
      row_sum, row_count = row_sum + value, row_count + 1
    per_row.append(row_sum / max(row_count, 1))
    total, count = total + row_sum, count + row_count
  return {"token": total / count, "sequence": float(np.mean(per_row)), "constant": total / (b * max_new)}[norm]


@pytest.mark.parametrize("scale", grpo.SCALE_REWARDS)
def test_advantages_match_numpy(scale):
  rewards = np.random.default_rng(0).integers(0, 2, (5, 4)).astype(np.float32)
  rewards[0] = 1.0  # a group that all solved: zero advantage, no division by zero
  np.testing.assert_allclose(grpo.advantages(rewards, scale), np_advantages(rewards, scale), rtol=1e-5, atol=1e-6)
  assert np.all(grpo.advantages(rewards, scale)[0] == 0)


@pytest.mark.parametrize("norm", grpo.LOSS_NORMS)
@pytest.mark.parametrize("beta", [0.0, 0.05])
def test_loss_matches_numpy(norm, beta):
  rng = np.random.default_rng(1)
  b, t = 6, 7
  logp = np.log(rng.uniform(0.05, 1.0, (b, t))).astype(np.float32)
  behaviour = (logp + rng.normal(0, 0.4, (b, t))).astype(np.float32)  # ratios far enough from 1 to clip
  ref = (logp + rng.normal(0, 0.2, (b, t))).astype(np.float32)
  adv = rng.normal(0, 1, b).astype(np.float32)
  mask = rng.uniform(size=(b, t)) < 0.7
  mask[:, 0] = True
  loss, sums = grpo.policy_loss(jnp.asarray(logp), jnp.asarray(behaviour), jnp.asarray(adv), jnp.asarray(mask),
                                jnp.asarray(ref), epsilon=0.2, epsilon_high=0.28, beta=beta, loss_norm=norm,
                                max_new_tokens=t)
  want = np_loss(logp, behaviour, adv, mask, ref, 0.2, 0.28, beta, norm, t)
  np.testing.assert_allclose(float(loss), want, rtol=1e-5)
  assert float(sums["tokens"]) == mask.sum()
  assert 0 < float(sums["clipped_sum"]) < mask.sum()  # the data exercise both branches of the min


def test_token_logprobs_is_log_softmax_at_temperature():
  logits = np.random.default_rng(2).normal(0, 3, (2, 3, 11)).astype(np.float32)
  targets = np.array([[1, 5, 10], [0, 0, 7]])
  got = np.asarray(grpo.token_logprobs(jnp.asarray(logits), jnp.asarray(targets), SamplingParams(temperature=0.7)))
  z = logits / 0.7
  want = np.take_along_axis(z, targets[..., None], -1)[..., 0] - np.log(np.exp(z).sum(-1))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_one_sample_per_prompt_is_refused():
  with pytest.raises(ValueError, match="n >= 2"):
    grpo.advantages(np.zeros((3, 1)), "group")


@pytest.mark.parametrize("sp", [SamplingParams(temperature=0.7, top_k=3), SamplingParams(temperature=0.7, top_p=0.6)],
                         ids=["top_k", "top_p"])
def test_token_logprobs_renormalise_over_the_tokens_the_filter_keeps(sp):
  """Written from the definition: keep the k most likely (top-k) or the smallest most-likely-first set reaching
  top_p (top-p), renormalise; a token left out gets the floor."""
  logits = np.random.default_rng(3).normal(0, 3, (1, 4, 9)).astype(np.float32)
  z = logits[0] / sp.temperature
  p = np.exp(z - z.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  targets = np.array([[np.argsort(-p[t])[t % 3] for t in range(3)] + [np.argmin(p[3])]])
  want = []
  for t, tok in enumerate(targets[0]):
    order = np.argsort(-p[t])
    if sp.top_k:
      keep = order[:sp.top_k]
    else:
      mass = np.cumsum(p[t][order]) - p[t][order]
      keep = order[mass < sp.top_p]
    want.append(np.log(p[t][tok] / p[t][keep].sum()) if tok in keep else LOGPROB_FLOOR)
  got = np.asarray(grpo.token_logprobs(jnp.asarray(logits), jnp.asarray(targets), sp))[0]
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  assert got[-1] == LOGPROB_FLOOR  # the least likely token is never kept by these filters


def _group(versions, rewards):
  from jaxpod.rl.rollout.groups import Group
  from jaxpod.problems.base import Problem
  n, k = len(rewards), len(versions)  # every sample: one token per version
  return Group(Problem("1+1=", "2"), [256], [[50] * k] * n, [[-0.5] * k] * n, [list(versions)] * n, [True] * n,
               [float(r) for r in rewards], [r > 0 for r in rewards])


@pytest.mark.parametrize("versions, rewards, filter_groups, want", [
    ((4, 5), (1.0, 0.0), True, "take"),
    ((5, 6), (1.0, 0.0), True, "future"),  # a token from weights this trainer (version 5) never made
    ((2, 5), (1.0, 0.0), True, "stale"),  # older than 5 - max_policy_lag 2
    ((3, 5), (1.0, 1.0), True, "uniform"),  # equal rewards: zero advantage
    ((3, 5), (1.0, 1.0), False, "take"),  # ... trained on without filter_groups
    ((1, 6), (1.0, 1.0), True, "future"),  # reasons in order: future, stale, uniform
], ids=["mixed", "future", "stale", "uniform", "uniform_unfiltered", "first_reason"])
def test_admit_takes_or_names_one_reason(versions, rewards, filter_groups, want):
  assert grpo.admit(_group(versions, rewards), trainer_version=5, max_policy_lag=2, filter_groups=filter_groups) == want


def test_both_topologies_take_and_drop_the_same_groups(tmp_path):
  """One admission rule: the colocated batch filler and the disaggregated trainer's pick over the queue take the
  same groups and drop the others for the same reasons, in the same order."""
  import dataclasses
  from jaxpod.rl.colocated import fill_batch
  from jaxpod.rl.disaggregated.queue import file_name, to_bytes
  from jaxpod.rl.config import GRPOConfig, RolloutConfig
  from jaxpod.rl.disaggregated.queue_source import QueueSource
  groups = [_group(v, r) for v, r in [((5, 5), (1, 1)), ((4, 5), (0, 1)), ((1, 5), (0, 1)), ((5, 6), (1, 0)),
                                      ((3, 3), (0, 1)), ((5, 5), (0, 0)), ((5, 5), (1, 0)), ((5, 5), (0, 1))]]
  for i, g in enumerate(groups):
    g.problem = dataclasses.replace(g.problem, index=i)
  grpo_cfg = GRPOConfig(num_prompts_per_step=3, max_policy_lag=2, filter_groups=True)
  fill = grpo_cfg.batch_fill(5)
  colocated = fill_batch(iter([groups[:4], groups[4:]]), fill)
  dropped = {why: fill.dropped(why) for why in grpo.DROP_REASONS}
  source = QueueSource(str(tmp_path / "run"), None, grpo_cfg, RolloutConfig(), batcher=None)
  for seq in range(3):
    source.queue.put(0, seq, to_bytes(groups[3 * seq:3 * seq + 3], {}))
  pick = source._pick(version=5)
  queued = [int(name.split("/")[1].split(".")[0]) * 3 + i for name, idxs in pick["take"] for i in idxs]
  assert [g.problem.index for g in colocated] == queued == [1, 4, 6]
  assert [(file_name(0, i // 3), i % 3, why) for i, why in [(0, "uniform"), (2, "stale"), (3, "future"),
                                                            (5, "uniform")]] == [tuple(d) for d in pick["drop"]]
  assert dropped == {"uniform": 2, "stale": 1, "future": 1}


def test_a_batch_gives_up_after_max_rounds_of_uniform_groups_in_both_topologies(tmp_path):
  """The one bound on the wait (`grpo.BatchFill`): with filter_groups, a policy that gets every problem equally
  wrong ends the colocated batch after max_sampling_rounds rounds and the disaggregated pick after as many groups
  from the queue, with the same one line (a ValueError: exit 2) naming grpo.filter_groups and the knobs; stale
  drops do not count toward it; the progress line names what each worker's groups were dropped for."""
  from jaxpod.rl.colocated import fill_batch
  from jaxpod.rl.config import GRPOConfig, RolloutConfig
  from jaxpod.rl.disaggregated.queue import to_bytes
  from jaxpod.rl.disaggregated.queue_source import QueueSource
  cfg = GRPOConfig(num_prompts_per_step=2, sample_prompts_per_step=4, max_sampling_rounds=3, max_policy_lag=2)
  uniform, stale, mixed = _group((5, 5), (0, 0)), _group((1, 5), (0, 1)), _group((5, 5), (0, 1))
  with pytest.raises(grpo.Starved) as colocated:
    fill_batch(iter([[uniform] * 3 + [mixed]] + [[uniform] * 4] * 10), cfg.batch_fill(5))
  source = QueueSource(str(tmp_path / "run"), None, cfg, RolloutConfig(), batcher=None)
  source.queue.put(0, 0, to_bytes([stale] * 4, {}))  # a backlog of stale groups: not the policy's fault
  for seq in range(1, 4):
    source.queue.put(0, seq, to_bytes([uniform] * 3 + [mixed] if seq == 1 else [uniform] * 4, {}))
  source.queue.put(1, 0, to_bytes([uniform] * 2, {}))
  pick = source._pick(version=5)
  assert pick["starved"] == str(colocated.value)
  assert isinstance(colocated.value, ValueError) and "\n" not in pick["starved"]
  assert pick["starved"].startswith("rl: grpo.filter_groups dropped 11 of the 12 groups judged for step 6 because "
                                    "every sample got the same reward (mean 0.00: the policy fails")
  for knob in ("warmup.steps", "(rewards)", "--task", "grpo.filter_groups false", "raise grpo.max_sampling_rounds"):
    assert knob in pick["starved"]
  fill = cfg.batch_fill(5)
  for name, why in (("w0", "stale"), ("w0", "uniform"), ("w1", "uniform"), ("w1", "uniform")):
    fill.take([stale if why == "stale" else uniform], f"worker {name[1]}")
  assert fill.describe() == ("0 of 2 groups taken, 3 of at most 12 judged on their rewards; worker 0: 0 taken, "
                             "dropped 1 stale, 1 uniform; worker 1: 0 taken, dropped 2 uniform")
  assert source.queue.progress()["stopped"] and source.queue.progress()["done"]  # the workers stop
