"""Preference losses (SimPO, DPO with cDPO label smoothing, IPO) on per-sequence log-probs: pure math, no model.

    logp, count = answer_logps(token_logp_BxT, answer_mask_BxT)    # [B] each (token_logp: models.llama.loss)
    per_pair, stats = pair_loss(LossConfig(kind="simpo"), logp_c, logp_r, n_c, n_r)            # [P] each
    per_pair, stats = pair_loss(LossConfig(kind="dpo"), logp_c, logp_r, n_c, n_r, ref_c, ref_r)

Conventions are TRL 1.16's (docs: shared/reference/preference.md), so a run's numbers read as users
know them: the loss is a mean over pairs; `rewards/*` are beta x summed log-ratio to the reference
for DPO and IPO, beta x length-averaged log-prob for SimPO (no gamma); `logps/*` are summed for DPO /
IPO and length-averaged for SimPO; `rewards/accuracies` counts a tie as wrong (strict >).
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

LOSS_KINDS = ("simpo", "dpo", "ipo")


@dataclasses.dataclass(frozen=True)
class LossConfig:
  """Which preference loss and its constants (names as in TRL / the SimPO repo)."""

  kind: str = "simpo"  # simpo (no reference model) | dpo (sigmoid; cDPO with label_smoothing) | ipo
  beta: float = 2.0  # SimPO: reward scale (paper default 2.0); DPO/IPO: KL strength (TRL default 0.1)
  gamma_beta_ratio: float = 0.25  # SimPO: target margin gamma = gamma_beta_ratio * beta (SimPO repo default)
  label_smoothing: float = 0.0  # cDPO / SimPO: assumed probability that a pair's labels are flipped, in [0, 0.5)

  def __post_init__(self):
    if self.kind not in LOSS_KINDS:
      raise ValueError(f"task.loss.kind={self.kind!r}: expected one of {', '.join(LOSS_KINDS)}")
    if self.beta <= 0:
      raise ValueError(f"task.loss.beta={self.beta}: expected > 0")
    if not 0.0 <= self.label_smoothing < 0.5:
      raise ValueError(f"task.loss.label_smoothing={self.label_smoothing}: expected a value in [0, 0.5)")
    if self.kind == "ipo" and self.label_smoothing:
      raise ValueError("task.loss.label_smoothing applies to dpo and simpo, not ipo; set it to 0")

  @property
  def needs_reference(self) -> bool:
    """DPO and IPO compare with a frozen reference model; SimPO does not."""
    return self.kind != "simpo"

  @property
  def gamma(self) -> float:
    """SimPO's absolute target margin (TRL CPO's `simpo_gamma`)."""
    return self.gamma_beta_ratio * self.beta


def answer_logps(token_logp_BxT: jax.Array, mask_BxT: jax.Array):
  """(sum of the tokens' log p(target) over masked positions [B], masked positions [B]) in float32."""
  mask = mask_BxT.astype(jnp.float32)
  return jnp.sum(token_logp_BxT.astype(jnp.float32) * mask, axis=-1), jnp.sum(mask, axis=-1)


def _smoothed_sigmoid_loss(logits_P: jax.Array, eps: float) -> jax.Array:
  """cDPO: -(1 - eps) log sigmoid(z) - eps log sigmoid(-z) (eps 0: the plain sigmoid loss)."""
  return -(1.0 - eps) * jax.nn.log_sigmoid(logits_P) - eps * jax.nn.log_sigmoid(-logits_P)


def pair_loss(cfg: LossConfig, logp_c: jax.Array, logp_r: jax.Array, n_c: jax.Array, n_r: jax.Array,
              ref_c: jax.Array | None = None, ref_r: jax.Array | None = None):
  """Per-pair loss [P] and per-pair TRL metrics {name: [P]} from summed answer log-probs and answer lengths.

  logp_*: summed policy log-probs of the chosen / rejected answers; n_*: their answer-token counts;
  ref_*: the same sums under the reference (DPO / IPO only)."""
  n_c, n_r = jnp.maximum(n_c, 1.0), jnp.maximum(n_r, 1.0)  # an empty answer never divides by zero
  avg_c, avg_r = logp_c / n_c, logp_r / n_r
  if cfg.kind == "simpo":
    rew_c, rew_r = cfg.beta * avg_c, cfg.beta * avg_r
    loss = _smoothed_sigmoid_loss(rew_c - rew_r - cfg.gamma, cfg.label_smoothing)
    logps_c, logps_r = avg_c, avg_r
  else:
    if ref_c is None or ref_r is None:
      raise ValueError(f"loss {cfg.kind} needs the reference log-probs")
    ratio_c, ratio_r = logp_c - ref_c, logp_r - ref_r
    if cfg.kind == "dpo":
      loss = _smoothed_sigmoid_loss(cfg.beta * (ratio_c - ratio_r), cfg.label_smoothing)
    else:  # ipo: per-token (length-averaged) log-ratios, as TRL (agreed with the IPO authors)
      h = (logp_c - ref_c) / n_c - (logp_r - ref_r) / n_r
      loss = (h - 1.0 / (2.0 * cfg.beta)) ** 2
    rew_c, rew_r = cfg.beta * ratio_c, cfg.beta * ratio_r
    logps_c, logps_r = logp_c, logp_r
  rew_c, rew_r = jax.lax.stop_gradient(rew_c), jax.lax.stop_gradient(rew_r)
  stats = {"rewards/chosen": rew_c, "rewards/rejected": rew_r, "rewards/margins": rew_c - rew_r,
           "rewards/accuracies": (rew_c > rew_r).astype(jnp.float32),
           "logps/chosen": jax.lax.stop_gradient(logps_c), "logps/rejected": jax.lax.stop_gradient(logps_r)}
  return loss, stats


METRICS = ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies", "logps/chosen",
           "logps/rejected")
