"""Preference losses match TRL 1.16's own loss code, value and gradient, on the same log-probs (fp32, <= 1e-5).

TRL's DPO loss lives inside `DPOTrainer._compute_loss`, which calls a model; the test calls that very
method with a stand-in that returns the given per-token log-probs (`LogProbsAsModel`), and with
precomputed reference log-probs, so every line of TRL's loss, reward and metric code runs. SimPO and
cDPO are TRL's `CPOTrainer.cpo_loss` (TRL's DPO `sigmoid` ignores label_smoothing; its cDPO lives there).
"""
from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from jaxpod.tasks.preference_loss import LossConfig, pair_loss  # noqa: E402

jax.config.update("jax_enable_x64", False)
PAIRS, T = 6, 9


@pytest.fixture(scope="module")
def logps():
  """Per-token policy log-probs [2P, T] (chosen rows first, as TRL stacks them), masks of uneven answers, refs."""
  rng = np.random.default_rng(0)
  per_token = -rng.uniform(0.05, 3.0, (2 * PAIRS, T)).astype(np.float32)
  lengths = rng.integers(1, T, 2 * PAIRS)
  mask = (np.arange(T)[None, :] >= T - lengths[:, None]).astype(np.float32)  # answer = the last `length` tokens
  ref = (per_token * mask).sum(1) + rng.normal(0, 0.7, 2 * PAIRS).astype(np.float32)
  return per_token, mask, ref.astype(np.float32)


def _jax_loss(cfg: LossConfig, per_token, mask, ref):
  """jaxpod's loss (mean over pairs) as a function of the per-token log-probs."""
  def loss(tok):
    sums, counts = jnp.sum(tok * mask, 1), jnp.sum(mask, 1)
    per_pair, stats = pair_loss(cfg, sums[:PAIRS], sums[PAIRS:], counts[:PAIRS], counts[PAIRS:],
                                *((ref[:PAIRS], ref[PAIRS:]) if cfg.needs_reference else ()))
    return jnp.mean(per_pair), stats
  (value, stats), grad = jax.value_and_grad(loss, has_aux=True)(jnp.asarray(per_token))
  return float(value), np.asarray(grad), {k: float(jnp.mean(v)) for k, v in stats.items()}


class LogProbsAsModel(torch.nn.Module):
  """Stand-in for the policy inside TRL's `_compute_loss`: returns the given per-token log-probs (shifted rows)."""

  def __init__(self, per_token):
    super().__init__()
    self.per_token = per_token

  def forward(self, labels=None, **_):
    shift = (labels[:, 1:] != -100).float()
    zeros = torch.zeros_like(self.per_token)
    return types.SimpleNamespace(log_probs=self.per_token * shift, entropy=zeros, mean_logits=zeros,
                                 is_top1=zeros.bool())


def _trl_dpo(loss_type: str, beta: float, per_token, mask, ref):
  """TRL's DPOTrainer._compute_loss on these log-probs: (loss, grad w.r.t. the per-token log-probs, metrics)."""
  from collections import defaultdict

  from accelerate import Accelerator
  from trl import DPOTrainer
  tok = torch.tensor(per_token, requires_grad=True)
  model = LogProbsAsModel(tok).train()
  completion = torch.tensor(np.concatenate([np.zeros((2 * PAIRS, 1)), mask], 1), dtype=torch.long)  # [2P, T+1]
  trainer = types.SimpleNamespace(
      model=model, accelerator=Accelerator(cpu=True), aux_loss_enabled=False, ld_alpha=None, precompute_ref_logps=True,
      f_divergence_type="reverse_kl", loss_types=[loss_type], loss_weights=[1.0], beta=beta, label_smoothing=0.0,
      use_weighting=False, _metrics={"train": defaultdict(list)}, _total_train_tokens=0, _tp_size=1, args=None)
  inputs = {"input_ids": torch.zeros_like(completion), "attention_mask": torch.ones_like(completion),
            "completion_mask": completion, "ref_chosen_logps": torch.tensor(ref[:PAIRS]),
            "ref_rejected_logps": torch.tensor(ref[PAIRS:])}
  loss = DPOTrainer._compute_loss(trainer, model, inputs, return_outputs=False)
  loss.backward()
  metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}
  return loss.item(), tok.grad.numpy(), metrics


def _trl_cpo(loss_type: str, beta: float, label_smoothing: float, simpo_gamma: float, chosen, rejected):
  """TRL's CPOTrainer.cpo_loss (mean over pairs) and its gradient w.r.t. (chosen, rejected) log-probs."""
  from accelerate import Accelerator
  from trl.experimental.cpo import CPOTrainer
  c, r = torch.tensor(chosen, requires_grad=True), torch.tensor(rejected, requires_grad=True)
  trainer = types.SimpleNamespace(alpha=0.0, accelerator=Accelerator(cpu=True), loss_type=loss_type, beta=beta,
                                  label_smoothing=label_smoothing, simpo_gamma=simpo_gamma)
  losses, rew_c, rew_r = CPOTrainer.cpo_loss(trainer, c, r)
  loss = losses.mean()
  loss.backward()
  return loss.item(), c.grad.numpy(), r.grad.numpy(), rew_c.detach().numpy(), rew_r.detach().numpy()


@pytest.mark.parametrize("kind,loss_type,beta", [("dpo", "sigmoid", 0.1), ("dpo", "sigmoid", 1.3), ("ipo", "ipo", 0.1),
                                                 ("ipo", "ipo", 0.7)])
def test_dpo_and_ipo_match_trl_dpo_trainer_loss_gradient_and_metrics(logps, kind, loss_type, beta):
  per_token, mask, ref = logps
  value, grad, stats = _jax_loss(LossConfig(kind=kind, beta=beta), per_token, mask, ref)
  trl_value, trl_grad, trl_metrics = _trl_dpo(loss_type, beta, per_token, mask, ref)
  assert abs(value - trl_value) <= 1e-5 * max(1.0, abs(trl_value))
  np.testing.assert_allclose(grad, trl_grad, atol=1e-5, rtol=1e-5)
  assert np.abs(grad).max() > 0  # the comparison is not between two zero gradients
  for name in ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies", "logps/chosen",
               "logps/rejected"):
    assert stats[name] == pytest.approx(trl_metrics[name], abs=1e-5, rel=1e-5), name


@pytest.mark.parametrize("beta,eps", [(0.1, 0.1), (0.5, 0.3)])
def test_dpo_label_smoothing_matches_trl_cdpo(logps, beta, eps):
  """cDPO: TRL's CPO `sigmoid` on the log-ratios to the reference is the label-smoothed DPO loss of one pair each."""
  per_token, mask, ref = logps
  value, grad, _ = _jax_loss(LossConfig(kind="dpo", beta=beta, label_smoothing=eps), per_token, mask, ref)
  sums = (per_token * mask).sum(1)
  ratio = sums - ref
  trl_value, g_c, g_r, _, _ = _trl_cpo("sigmoid", beta, eps, 0.0, ratio[:PAIRS], ratio[PAIRS:])
  assert abs(value - trl_value) <= 1e-5 * max(1.0, abs(trl_value))
  np.testing.assert_allclose(grad, np.concatenate([g_c, g_r])[:, None] * mask, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("beta,ratio,eps", [(2.0, 0.25, 0.0), (2.5, 0.55, 0.0), (10.0, 0.3, 0.1)])
def test_simpo_matches_trl_cpo_simpo(logps, beta, ratio, eps):
  """SimPO = TRL CPO loss_type=simpo (cpo_alpha=0) on length-averaged log-probs with simpo_gamma = ratio * beta."""
  per_token, mask, ref = logps
  value, grad, stats = _jax_loss(LossConfig(kind="simpo", beta=beta, gamma_beta_ratio=ratio, label_smoothing=eps),
                                 per_token, mask, ref)
  avg = (per_token * mask).sum(1) / mask.sum(1)
  trl_value, g_c, g_r, rew_c, rew_r = _trl_cpo("simpo", beta, eps, ratio * beta, avg[:PAIRS], avg[PAIRS:])
  assert abs(value - trl_value) <= 1e-5 * max(1.0, abs(trl_value))
  chain = np.concatenate([g_c, g_r])[:, None] * mask / mask.sum(1, keepdims=True)  # d avg / d token = mask / |y|
  np.testing.assert_allclose(grad, chain, atol=1e-5, rtol=1e-5)
  assert stats["rewards/chosen"] == pytest.approx(rew_c.mean(), abs=1e-5)
  assert stats["rewards/rejected"] == pytest.approx(rew_r.mean(), abs=1e-5)
  assert stats["rewards/accuracies"] == pytest.approx(float(np.mean(rew_c > rew_r)))


def test_a_tie_counts_as_a_wrong_preference():
  cfg = LossConfig(kind="simpo")
  _, stats = pair_loss(cfg, jnp.array([-2.0]), jnp.array([-2.0]), jnp.array([2.0]), jnp.array([2.0]))
  assert float(stats["rewards/accuracies"][0]) == 0.0


def test_bad_loss_settings_name_the_field():
  with pytest.raises(ValueError, match="task.loss.kind"):
    LossConfig(kind="orpo")
  with pytest.raises(ValueError, match="task.loss.label_smoothing"):
    LossConfig(kind="dpo", label_smoothing=0.5)
