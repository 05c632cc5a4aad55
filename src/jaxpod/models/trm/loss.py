"""TRM loss head: stablemax/softmax cross entropy, q-halt BCE, reference metrics, the loss the trainer differentiates.

Losses are computed in fp32 (the reference uses float64 for stablemax; the difference is
~1e-7 relative on these magnitudes, see tests). Metrics are raw sums, as the reference
returns them; the trainer normalises (keys ending in "loss" by the global batch, the rest
by max(count, 1)).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxpod.models.trm.model import TRMCarry, act_step

IGNORE_LABEL_ID = -100


def _stablemax_s(x):
  return jnp.where(x < 0, 1.0 / (1.0 - x + 1e-30), x + 1.0)


def stablemax_cross_entropy(logits_BxSxV, labels_BxS, valid_BxS):
  """Per-token -log(s(x_y) / sum s(x)) with s(x) = x+1 (x >= 0), 1/(1-x) (x < 0); 0 where not valid."""
  s = _stablemax_s(logits_BxSxV.astype(jnp.float32))
  logp = jnp.log(s / jnp.sum(s, axis=-1, keepdims=True))
  safe = jnp.where(valid_BxS, labels_BxS, 0)
  picked = jnp.take_along_axis(logp, safe[..., None], axis=-1)[..., 0]
  return -jnp.where(valid_BxS, picked, 0.0)


def softmax_cross_entropy(logits_BxSxV, labels_BxS, valid_BxS):
  """Per-token softmax cross entropy in fp32; 0 where not valid."""
  logp = jax.nn.log_softmax(logits_BxSxV.astype(jnp.float32), axis=-1)
  safe = jnp.where(valid_BxS, labels_BxS, 0)
  picked = jnp.take_along_axis(logp, safe[..., None], axis=-1)[..., 0]
  return -jnp.where(valid_BxS, picked, 0.0)


_LOSSES = {"stablemax_cross_entropy": stablemax_cross_entropy, "softmax_cross_entropy": softmax_cross_entropy}


def act_loss(carry: TRMCarry, outputs: dict, loss_type: str = "stablemax_cross_entropy"):
  """(loss, metrics, preds) for one ACT step, given the step's new carry and outputs.

  loss = lm_loss + 0.5 * q_halt_loss, both summed over all rows; metrics count halted rows
  with at least one valid label.
  """
  labels = carry.current_data["labels"]
  logits, q_halt = outputs["logits"], outputs["q_halt_logits"]
  mask = labels != IGNORE_LABEL_ID
  counts = mask.sum(-1)
  divisor = jnp.maximum(counts, 1)[:, None].astype(jnp.float32)
  preds = jnp.argmax(logits, axis=-1).astype(jnp.int32)
  is_correct = mask & (preds == labels)
  seq_correct = is_correct.sum(-1) == counts
  valid = carry.halted & (counts > 0)
  token_ce = _LOSSES[loss_type](logits, labels, mask)
  lm_loss = jnp.sum(token_ce / divisor)
  target = jax.lax.stop_gradient(seq_correct.astype(jnp.float32))
  q_halt_loss = jnp.sum(jnp.maximum(q_halt, 0) - q_halt * target + jnp.log1p(jnp.exp(-jnp.abs(q_halt))))
  loss = lm_loss + 0.5 * q_halt_loss
  sg = jax.lax.stop_gradient
  metrics = {
      "count": valid.sum().astype(jnp.int32),
      "accuracy": jnp.sum(jnp.where(valid, (is_correct.astype(jnp.float32) / divisor).sum(-1), 0.0)),
      "exact_accuracy": (valid & seq_correct).sum().astype(jnp.int32),
      "q_halt_accuracy": (valid & ((sg(q_halt) >= 0) == seq_correct)).sum().astype(jnp.int32),
      "steps": jnp.where(valid, carry.steps, 0).sum().astype(jnp.int32),
      "lm_loss": sg(lm_loss),
      "q_halt_loss": sg(q_halt_loss),
  }
  return loss, metrics, preds


def train_loss(graphdef, params, buffers, carry: TRMCarry, batch: dict, rng, loss_type: str = "stablemax_cross_entropy"):
  """Differentiable in `params`: (loss / global_batch, (new_carry, outputs, metrics)).

  Use `jax.value_and_grad(train_loss, argnums=1, has_aux=True)` inside one jitted step. The batch
  is the global batch, so dividing by its row count is the reference's `loss / global_batch_size`,
  and a global gradient already sums over hosts.
  """
  new_carry, outputs = act_step(graphdef, params, buffers, carry, batch, rng, train=True)
  loss, metrics, preds = act_loss(new_carry, outputs, loss_type)
  outputs = dict(jax.lax.stop_gradient(outputs), preds=preds)
  metrics["loss"] = jax.lax.stop_gradient(loss)
  return loss / batch["inputs"].shape[0], (new_carry, outputs, metrics)


def eval_step(graphdef, params, buffers, carry: TRMCarry, batch: dict, loss_type: str = "stablemax_cross_entropy"):
  """Eval-mode ACT step (halting only at halt_max_steps): (new_carry, outputs, metrics, all_finish)."""
  new_carry, outputs = act_step(graphdef, params, buffers, carry, batch, None, train=False)
  loss, metrics, preds = act_loss(new_carry, outputs, loss_type)
  metrics["loss"] = loss
  return new_carry, dict(outputs, preds=preds), metrics, new_carry.halted.all()


def normalize_metrics(metrics: dict, global_batch_size: int) -> dict:
  """What the reference logs in training: keys ending in 'loss' / global batch, the rest / max(count, 1)."""
  count = max(int(metrics["count"]), 1)
  return {k: float(v) / (global_batch_size if k.endswith("loss") else count) for k, v in metrics.items()}


def normalize_eval_metrics(metrics: dict) -> dict:
  """What the reference logs in evaluation (summed over batches first): every metric but count / count."""
  count = max(int(metrics["count"]), 1)
  return {k: float(v) / count for k, v in metrics.items() if k != "count"}
