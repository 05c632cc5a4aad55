"""GRPO advantages and loss against a small NumPy implementation written from the formulas, loop by loop."""
import functools

import jax
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
  from jaxpod.policy.rollout.groups import Group
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
  for knob in ("warmup.steps", "(rewards)", "--problems", "grpo.filter_groups false", "raise grpo.max_sampling_rounds"):
    assert knob in pick["starved"]
  fill = cfg.batch_fill(5)
  for name, why in (("w0", "stale"), ("w0", "uniform"), ("w1", "uniform"), ("w1", "uniform")):
    fill.take([stale if why == "stale" else uniform], f"worker {name[1]}")
  assert fill.describe() == ("0 of 2 groups taken, 3 of at most 12 judged on their rewards; worker 0: 0 taken, "
                             "dropped 1 stale, 1 uniform; worker 1: 0 taken, dropped 2 uniform")
  assert source.queue.progress()["stopped"] and source.queue.progress()["done"]  # the workers stop


def test_a_batch_starved_by_solved_problems_ends_the_run_as_a_success_in_both_topologies(tmp_path):
  """A policy that solves what it draws (most groups judged had every sample correct) is not an error: the bound
  gives up with `grpo.Solved` (an `EndOfData`: the trainer ends at its last step, exit 0), the same one line in both
  topologies; the disaggregated leader tells the workers the trainer is done, not that it stopped; a set the policy
  half solves and half fails is still `Starved`."""
  from jaxpod.rl.colocated import fill_batch
  from jaxpod.rl.config import GRPOConfig, RolloutConfig
  from jaxpod.rl.disaggregated.queue import to_bytes
  from jaxpod.rl.disaggregated.queue_source import QueueSource
  from jaxpod.train.task import EndOfData
  cfg = GRPOConfig(num_prompts_per_step=2, sample_prompts_per_step=4, max_sampling_rounds=3)
  solved, failed, mixed = _group((5, 5), (1, 1)), _group((5, 5), (0, 0)), _group((5, 5), (0, 1))
  with pytest.raises(grpo.Solved) as colocated:
    fill_batch(iter([[solved] * 3 + [mixed]] + [[solved] * 4] * 10), cfg.batch_fill(5))
  assert isinstance(colocated.value, EndOfData) and not isinstance(colocated.value, ValueError)
  assert str(colocated.value).startswith("rl: the policy solves its training problems: 11 of the 12 groups judged "
                                         "for step 6 had every sample correct and 1 of the 2 needed")
  assert "the run ends at step 5" in str(colocated.value) and "\n" not in str(colocated.value)
  source = QueueSource(str(tmp_path / "run"), None, cfg, RolloutConfig(), batcher=None)
  for seq in range(3):
    source.queue.put(0, seq, to_bytes([solved] * 3 + [mixed] if seq == 0 else [solved] * 4, {}))
  pick = source._pick(version=5)
  assert pick == {"solved": str(colocated.value)}
  assert source.queue.progress()["done"] and not source.queue.progress().get("stopped")
  with pytest.raises(grpo.Starved):  # 6 solved, 6 failed of 12: not most solved
    fill_batch(iter([[solved, failed] * 2] * 3), cfg.batch_fill(5))


def test_a_colocated_buffer_that_ended_raises_solved_and_checkpoints_the_start_of_its_rounds(tmp_path):
  """Invariant 5 for RL: the checkpoint written as a solved run ends holds where the batch that was not trained
  started drawing problems (not past its rounds), so a rerun draws the same rounds and ends at the same step; the
  trainer's next batch is the `Solved` itself."""
  import draccus
  from jaxpod.rl.config import RLConfig
  from jaxpod.rl.run import batch_source, policy_spec
  from tests.rl.clusters import TINY
  cfg = draccus.parse(RLConfig, args=[*TINY, "--trainer.runs_dir", str(tmp_path)])
  buffer = batch_source(cfg, str(tmp_path / "run"), policy_spec(cfg, str(tmp_path / "run")))
  buffer.trained, buffer.ready_from, buffer.cursor = 5, 640, 640 + 8 * 128  # 8 rounds drawn for batch 6, none full
  buffer.ended = grpo.Solved("rl: the policy solves its training problems")
  assert buffer.get_state() == {"trained": 5, "cursor": 640}
  with pytest.raises(grpo.Solved):
    next(buffer)


# ----------------------------------------------------------------------------- off-policy corrections
def np_corrected_loss(logp, behaviour, adv, mask, ref, beta, norm, max_new, tis, cap, mis, low, high):
  """The published TIS / MIS (decoupled: the clipped ratio against pi_old = pi, so it is 1), loop by loop."""
  b, t = logp.shape
  per_row, total, count = [], 0.0, 0
  for i in range(b):
    tok = [j for j in range(t) if mask[i, j]]
    s = {j: np.exp(np.clip(logp[i, j] - behaviour[i, j], -20, 20)) for j in tok}
    log_seq = sum(logp[i, j] - behaviour[i, j] for j in tok)
    seq = {"sequence": np.exp(np.clip(log_seq, -20, 20)), "geometric": np.exp(np.clip(log_seq / len(tok), -20, 20))}
    row_sum = 0.0
    for j in tok:
      w = {"none": s[j], "token": min(s[j], cap), "sequence": min(seq.get("sequence", 0), cap)}[tis]
      r = s[j] if mis == "token" else seq.get(mis, 1.0)
      keep = mis == "none" or low <= r <= high
      value = -w * adv[i]  # min(r*A, clip(r)*A) at r = 1
      if beta:
        d = ref[i, j] - logp[i, j]
        value += beta * (np.exp(d) - d - 1)
      row_sum += value if keep else 0.0
    per_row.append(row_sum / max(len(tok), 1))
    total, count = total + row_sum, count + len(tok)
  return {"token": total / count, "sequence": float(np.mean(per_row)), "constant": total / (b * max_new)}[norm]


@pytest.mark.parametrize("tis, mis, norm, beta", [
    ("token", "none", "token", 0.0), ("sequence", "none", "sequence", 0.05), ("none", "token", "token", 0.05),
    ("none", "sequence", "constant", 0.0), ("none", "geometric", "token", 0.0), ("token", "token", "sequence", 0.0),
    ("sequence", "sequence", "token", 0.05)])
def test_corrections_match_numpy(tis, mis, norm, beta):
  """TIS and MIS match a NumPy implementation of the published formulas (issue 35), with every normalisation."""
  rng = np.random.default_rng(4)
  b, t = 8, 5
  logp = np.log(rng.uniform(0.05, 1.0, (b, t))).astype(np.float32)
  behaviour = (logp + rng.normal(0, 0.5, (b, t)) * (rng.uniform(size=(b, 1)) < 0.5)).astype(np.float32)
  ref = (logp + rng.normal(0, 0.2, (b, t))).astype(np.float32)
  adv = rng.normal(0, 1, b).astype(np.float32)
  mask = rng.uniform(size=(b, t)) < 0.8
  mask[:, 0] = True
  low, high = (0.85, 1.15) if mis == "geometric" else (0.6, 1.6)  # a mean of log-ratios spreads less
  kw = dict(tis=tis, tis_cap=1.5, mis=mis, mis_low=low, mis_high=high)
  loss, sums = grpo.policy_loss(jnp.asarray(logp), jnp.asarray(behaviour), jnp.asarray(adv), jnp.asarray(mask),
                                jnp.asarray(ref), epsilon=0.2, epsilon_high=0.28, beta=beta, loss_norm=norm,
                                max_new_tokens=t, **kw)
  want = np_corrected_loss(logp, behaviour, adv, mask, ref, beta, norm, t, tis, 1.5, mis, low, high)
  np.testing.assert_allclose(float(loss), want, rtol=1e-5, atol=1e-7)
  assert float(sums["clipped_sum"]) == 0  # the clip is against pi_old = pi: the gap to mu is in the weight alone
  ratio = np.exp(logp - behaviour)[mask]
  np.testing.assert_allclose([float(sums["ratio_min"]), float(sums["ratio_max"])], [ratio.min(), ratio.max()],
                             rtol=1e-6)
  if mis != "none":
    assert 0 < float(sums["mis_masked_sum"]) < mask.sum()  # the data exercise both sides of the band
  if tis != "none":
    assert 0 < float(sums["tis_truncated_sum"]) < mask.sum()


def _logit_batch():
  """A hand-built batch: 3 samples x 4 completion tokens over 5 symbols; mu differs from pi on chosen tokens."""
  rng = np.random.default_rng(5)
  logits = rng.normal(0, 1, (3, 4, 5)).astype(np.float32)
  targets = rng.integers(0, 5, (3, 4))
  z = logits - logits.max(-1, keepdims=True)
  probs = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
  logp = np.log(np.take_along_axis(probs, targets[..., None], -1)[..., 0])
  log_s = np.zeros((3, 4), np.float32)  # log(pi / mu): mu = pi except ...
  log_s[0, 1] = np.log(5.0)  # pi 5x the sampler's: above every cap and band below
  log_s[1, 2] = np.log(0.2)  # pi a fifth of it: below the band
  log_s[2, 3] = np.log(1.2)  # inside the band, under the cap
  mu = (logp - log_s).astype(np.float32)
  adv = np.array([1.0, -0.5, 2.0], np.float32)
  onehot = np.eye(5, dtype=np.float32)[targets]
  return logits, targets, mu, adv, np.exp(log_s), onehot - probs  # d logp / d logits = onehot - softmax


@functools.partial(jax.jit, static_argnames=("tis", "mis"))
def _loss_and_grad(logits, targets, mu, adv, tis="none", mis="none", **bounds):
  """(metric sums, d loss / d logits), jitted once per (tis, mis): the bounds are traced."""
  def f(lg):
    logp = jnp.take_along_axis(jax.nn.log_softmax(lg), targets[..., None], -1)[..., 0]
    return grpo.policy_loss(logp, mu, adv, jnp.ones(targets.shape, bool), epsilon=0.2, epsilon_high=0.28, beta=0.0,
                            loss_norm="token", max_new_tokens=4, tis=tis, mis=mis, **bounds)
  (_, sums), g = jax.value_and_grad(f, has_aux=True)(logits)
  return sums, g


def _grad(logits, targets, mu, adv, **kw):
  sums, g = _loss_and_grad(*map(jnp.asarray, (logits, targets, mu, adv)), **kw)
  return np.asarray(g), {k: float(v) for k, v in sums.items()}


def test_tis_caps_the_weight_and_still_trains_the_truncated_token():
  """TIS: the gradient w.r.t. the logits is -(1/N) sum_t min(pi/mu, C) A (onehot - softmax): the token with ratio 5
  trains at weight C = 2 (PPO's clip against mu, the default, gives it no gradient at all)."""
  logits, targets, mu, adv, s, dlogp = _logit_batch()
  got, sums = _grad(logits, targets, mu, adv, tis="token", tis_cap=2.0)
  w = np.minimum(s, 2.0)
  want = -(w * adv[:, None])[..., None] * dlogp / 12
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
  assert sums["tis_truncated_sum"] == 1 and sums["is_weight_sum"] == pytest.approx(w.sum(), rel=1e-5)
  off, off_sums = _grad(logits, targets, mu, adv)
  assert np.all(off[0, 1] == 0) and np.abs(got[0, 1]).max() > 0 and "tis_truncated_sum" not in off_sums
  assert off_sums["ratio_max"] == pytest.approx(5.0, rel=1e-5) and off_sums["ratio_min"] == pytest.approx(0.2, rel=1e-5)


@pytest.mark.parametrize("mis", ["token", "sequence"])
def test_mis_drops_the_masked_tokens_or_whole_samples(mis):
  """Token MIS zeroes exactly the tokens whose ratio leaves [0.5, 2] (the kept ones train at weight pi/mu); sequence
  MIS drops every token of a sample whose product ratio leaves it; the fractions count them."""
  logits, targets, mu, adv, s, dlogp = _logit_batch()
  got, sums = _grad(logits, targets, mu, adv, mis=mis, mis_low=0.5, mis_high=2.0)
  ratio = s if mis == "token" else np.broadcast_to(s.prod(1, keepdims=True), s.shape)
  keep = (ratio >= 0.5) & (ratio <= 2.0)
  want = -(keep * s * adv[:, None])[..., None] * dlogp / 12
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
  dropped = [(0, 1), (1, 2)] if mis == "token" else [(0, j) for j in range(4)] + [(1, j) for j in range(4)]
  assert sorted(zip(*np.nonzero(~keep))) == dropped
  for i, j in dropped:
    assert np.all(got[i, j] == 0)
  assert np.abs(got[2]).min() > 0  # the last sample (ratio 1.2, inside the band) trains whole
  metrics = grpo.correction_metrics(sums, global_batch=3)
  assert metrics["mis_fraction"] == len(dropped) / 12
  assert metrics["mis_seq_fraction"] == (0 if mis == "token" else 2 / 3)


def test_corrections_off_are_exactly_todays_loss():
  """With tis and mis "none" (the defaults) the loss, its gradient and its metric sums are those of the plain
  clipped objective bit for bit (existing runs and figures do not move)."""
  logits, targets, mu, adv, _, _ = _logit_batch()
  default, default_sums = _grad(logits, targets, mu, adv)
  off, off_sums = _grad(logits, targets, mu, adv, tis="none", mis="none", tis_cap=3.0, mis_low=0.1, mis_high=9.0)
  assert np.array_equal(default, off) and default_sums == off_sums
  assert not {"is_weight_sum", "tis_truncated_sum", "mis_masked_sum"} & set(off_sums)


@pytest.mark.parametrize("argv, message", [
    (["--grpo.tis", "always"], "rl.grpo.tis='always' / mis='none'; use one of ('none', 'token', 'sequence') / "),
    (["--grpo.mis", "seq"], "rl.grpo.tis='none' / mis='seq'; use one of"),
    (["--grpo.tis_cap", "0"], "rl.grpo.tis_cap=0.0 must be > 0"),
    (["--grpo.mis_low", "2", "--grpo.mis_high", "0.5"], "0 <= mis_low=2.0 < mis_high=0.5"),
])
def test_bad_correction_options_are_one_line_before_jax(argv, message, capsys, tmp_path):
  """invariant 7: a bad off-policy option fails in one line naming the field, before JAX starts."""
  from jaxpod.cli.main import main
  code = main(["rl", "--trainer.runs_dir", str(tmp_path / "runs"), *argv])
  err = capsys.readouterr().err.strip()
  assert code == 2 and message in err and len(err.splitlines()) == 1, err


def test_jaxpod_rl_flags_reach_the_trainers_loss_and_metrics(tmp_path):
  """The wiring, without a launch: `jaxpod rl --grpo.tis ... --grpo.mis ...` parsed as the CLI does, through
  run.py's GRPO TrainConfig and task, to the jitted loss on a batch where mu differs from pi and the logged
  metrics (is_weight, tis_fraction, mis_fraction, ratio_min/max)."""
  import draccus
  from flax import nnx
  from jaxpod.rl.config import RLConfig
  from jaxpod.policy.spec import PolicySpec
  from jaxpod.rl.grpo_task import GRPOTask
  from jaxpod.rl.run import grpo_config
  from tests.rl.clusters import TINY
  cfg = draccus.parse(RLConfig, args=[*TINY, "--grpo.tis", "token", "--grpo.tis_cap", "1.5", "--grpo.mis", "token",
                                      "--grpo.mis_low", "0.25", "--grpo.mis_high", "4"])
  task = GRPOTask(grpo_config(cfg, str(tmp_path), PolicySpec(cfg.model)), source=None)  # a random start, no batches
  graphdef, shapes, buffers = task.abstract_model(0)
  rng = np.random.default_rng(6)
  params = jax.tree.map(lambda x: rng.normal(0, 0.1, x.shape).astype(x.dtype), shapes)  # no jitted random init
  rows, length = 4, cfg.rollout.cache_len
  tokens = rng.integers(0, 256, (rows, length)).astype(np.int32)
  loss_mask = np.zeros((rows, length), np.int32)
  loss_mask[:, 8:length - 1] = 1  # completion tokens, target-aligned
  shift = np.zeros((rows, length), np.float32)
  shift[0, 8], shift[1, 9] = np.log(2.0), np.log(8.0)  # pi / mu = 2 (truncated to 1.5) and 8 (masked)

  def step(params):  # mu = pi / exp(shift), pi the trainer's own log-probs of the rows
    logp = grpo.token_logprobs(nnx.merge(graphdef, params)(tokens[:, :-1]).logits, tokens[:, 1:],
                               cfg.rollout.sampling())
    batch = {"tokens": tokens, "loss_mask": loss_mask, "behaviour": jnp.pad(logp, ((0, 0), (0, 1))) - shift,
             "advantages": jnp.ones(rows), "reward": jnp.ones(rows), "correct": jnp.ones(rows)}
    return task.loss_fn(graphdef)(params, buffers, batch, None, ())[1][1]
  sums = jax.jit(step)(params)
  metrics = task.normalize({k: float(v) for k, v in sums.items()}, rows)
  n = loss_mask.sum()
  assert metrics["tis_fraction"] == pytest.approx(2 / n) and metrics["mis_fraction"] == pytest.approx(1 / n)
  assert metrics["is_weight"] == pytest.approx((n - 2 + 1.5) / n, rel=1e-4)
  assert metrics["ratio_max"] == pytest.approx(8.0, rel=1e-4) and metrics["mis_seq_fraction"] == 0
  assert metrics["row_len"] == length  # tokens per trained row: what grpo.trim_rows cut the batch to


def test_policy_logprobs_match_plain_log_softmax():
  """The chunked, rematerialised log-prob path (no [B, T, V] logits) equals log_softmax(logits / T) of the whole
  logits at the target, in value and in its gradient."""
  from flax import nnx
  from jaxpod.models.llama import model as llama
  from jaxpod.models.llama.config import LlamaConfig
  cfg = LlamaConfig(vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                    num_key_value_heads=1, max_position_embeddings=32, tie_word_embeddings=False)
  graphdef, params = nnx.split(llama.init(cfg, 0))
  tokens = jnp.asarray(np.random.default_rng(3).integers(0, 61, (3, 12)), jnp.int32)
  inputs, targets = tokens[:, :-1], tokens[:, 1:]
  weight = jnp.asarray(np.random.default_rng(4).normal(size=(3, 11)), jnp.float32)
  sampling = SamplingParams(temperature=0.8)

  def plain(p):
    logp = jax.nn.log_softmax(llama.forward(graphdef, p, inputs).logits / sampling.temperature, axis=-1)
    return jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]

  def chunked(p):  # 11 positions: chunks of 4, 4, 3
    return grpo.policy_logprobs(graphdef, p, inputs, targets, sampling, chunk=4)

  def weighted(p, f):
    logp = f(p)
    return jnp.sum(logp * weight), logp
  grad = jax.jit(jax.grad(weighted, has_aux=True), static_argnums=1)
  (g_new, logp_new), (g_old, logp_old) = grad(params, chunked), grad(params, plain)
  np.testing.assert_allclose(logp_new, logp_old, rtol=1e-5, atol=1e-5)
  for a, b in zip(jax.tree.leaves(g_new), jax.tree.leaves(g_old)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("norm", grpo.LOSS_NORMS)
def test_trimmed_rows_give_the_same_loss_and_gradient(norm):
  """grpo.trim_rows cuts only padding after every row's last token: causal attention never reads it and the loss
  mask is 0 there, so the GRPO loss and its gradient are the full-length batch's."""
  from flax import nnx
  from jaxpod.models.llama import model as llama
  from jaxpod.models.llama.config import LlamaConfig
  from jaxpod.rl.batch import Batcher
  from tests.rl.test_groups import _random_groups
  cfg = LlamaConfig(vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                    num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=False)
  graphdef, params = nnx.split(llama.init(cfg, 0))
  groups = _random_groups(np.random.default_rng(2), [(9, (3, 20, 7)), (14, (1, 5, 12))])
  sampling = SamplingParams(temperature=0.8)

  def loss(p, batch):
    tokens = jnp.asarray(batch["tokens"])
    logp = grpo.policy_logprobs(graphdef, p, tokens[:, :-1], tokens[:, 1:], sampling)
    return grpo.policy_loss(logp, jnp.asarray(batch["behaviour"][:, :-1]), jnp.asarray(batch["advantages"]),
                            jnp.asarray(batch["loss_mask"][:, :-1] > 0), epsilon=0.2, epsilon_high=0.28, beta=0.0,
                            loss_norm=norm, max_new_tokens=32)[0]
  grads = jax.value_and_grad(loss)
  value_full, grad_full = grads(params, Batcher(64, 0, "group").global_batch(groups))
  trimmed = Batcher(64, 0, "group", trim=True).global_batch(groups)
  assert trimmed["tokens"].shape[1] == 32
  value_trim, grad_trim = grads(params, trimmed)
  np.testing.assert_allclose(value_trim, value_full, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(grad_trim), jax.tree.leaves(grad_full)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
