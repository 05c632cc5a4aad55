"""TRM optimizers as optax transformations: AdamATan2, SignSGD for the puzzle-embedding table, the schedule.

`make_optimizer(cfg)` partitions the parameters by path: everything under `puzzle_emb` gets
SignSGD (decoupled weight decay on the rows used this step), the rest AdamATan2. Both follow
one warmup(-cosine) schedule, evaluated like the reference's `compute_lr` (whose step counter
is incremented before the first update).
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxpod.models.trm.config import TRMOptimConfig

ScalarOrSchedule = float | Callable[[jax.Array], jax.Array]

PUZZLE_EMB = "puzzle_emb"
ADAM = "adam_atan2"


def warmup_schedule(base_lr: float, warmup_steps: int, total_steps: int = 0, min_ratio: float = 1.0) -> optax.Schedule:
  """lr for optax update `count` (0-based) = the reference lr at its step count+1.

  Linear warmup base*step/warmup, then cosine from base to base*min_ratio over total_steps
  (constant when min_ratio == 1).
  """
  def schedule(count):
    step = jnp.asarray(count, jnp.float32) + 1.0
    warm = base_lr * step / max(1, warmup_steps)
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    cos = base_lr * (min_ratio + jnp.maximum(0.0, (1 - min_ratio) * 0.5 * (1.0 + jnp.cos(math.pi * progress))))
    return jnp.where(step < warmup_steps, warm, cos)
  return schedule


def _lr(learning_rate: ScalarOrSchedule, count):
  return learning_rate(count) if callable(learning_rate) else jnp.asarray(learning_rate, jnp.float32)


class AdamATan2State(NamedTuple):
  count: jax.Array  # int32 [], updates taken so far
  mu: optax.Updates  # first moment
  nu: optax.Updates  # second moment


def adam_atan2(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.95,
               weight_decay: float = 0.0) -> optax.GradientTransformation:
  """AdamATan2 as the reference: p *= 1 - lr*wd; m, v lerp; p -= lr/(1-b1^t) * atan2(m, sqrt(v)/sqrt(1-b2^t))."""
  def init_fn(params):
    zeros = jax.tree.map(jnp.zeros_like, params)
    return AdamATan2State(jnp.zeros([], jnp.int32), zeros, jax.tree.map(jnp.zeros_like, params))

  def update_fn(grads, state, params):
    if params is None:
      raise ValueError("adam_atan2 applies decoupled weight decay and needs `params` in update()")
    lr = _lr(learning_rate, state.count)
    t = (state.count + 1).astype(jnp.float32)
    mu = jax.tree.map(lambda m, g: m + (1 - b1) * (g - m), state.mu, grads)
    nu = jax.tree.map(lambda v, g: v + (1 - b2) * (g * g - v), state.nu, grads)
    step_size = lr / (1 - b1 ** t)
    bc2_sqrt = jnp.sqrt(1 - b2 ** t)

    def one(m, v, p):
      return -lr * weight_decay * p - step_size * jnp.arctan2(m, jnp.sqrt(v) / bc2_sqrt)
    updates = jax.tree.map(one, mu, nu, params)
    return updates, AdamATan2State(state.count + 1, mu, nu)

  return optax.GradientTransformation(init_fn, update_fn)


class SignSGDState(NamedTuple):
  count: jax.Array  # int32 [], updates taken so far


def sign_sgd(learning_rate: ScalarOrSchedule, weight_decay: float = 0.0) -> optax.GradientTransformation:
  """p = p * (1 - lr*wd) - lr * sign(g) on the rows (leading axis) that received gradient; others untouched.

  The gradient of an embedding table is already the per-identifier sum over every batch row
  (every host's rows too, for a global batch), as the reference's scatter-add. A row counts as
  used when any entry of its summed gradient is non-zero.
  """
  def init_fn(params):
    del params
    return SignSGDState(jnp.zeros([], jnp.int32))

  def update_fn(grads, state, params):
    if params is None:
      raise ValueError("sign_sgd applies decoupled weight decay and needs `params` in update()")
    lr = _lr(learning_rate, state.count)

    def one(g, p):
      used = jnp.any(g != 0, axis=tuple(range(1, g.ndim)), keepdims=True) if g.ndim > 1 else g != 0
      return jnp.where(used, -lr * weight_decay * p - lr * jnp.sign(g), 0.0).astype(p.dtype)
    return jax.tree.map(one, grads, params), SignSGDState(state.count + 1)

  return optax.GradientTransformation(init_fn, update_fn)


def _path_names(path) -> list[str]:
  names = []
  for k in path:
    for attr in ("key", "name", "idx"):
      if hasattr(k, attr):
        names.append(str(getattr(k, attr)))
        break
  return names


def param_labels(params):
  """Optimizer label per leaf by path: 'puzzle_emb' for the puzzle-embedding table, else 'adam_atan2'."""
  return jax.tree_util.tree_map_with_path(
      lambda path, _: PUZZLE_EMB if PUZZLE_EMB in _path_names(path) else ADAM, params)


def make_optimizer(cfg: TRMOptimConfig) -> optax.GradientTransformation:
  """AdamATan2 (network) + SignSGD (puzzle-embedding table), partitioned by parameter path."""
  sched = warmup_schedule(cfg.lr, cfg.warmup_steps, cfg.total_steps, cfg.lr_min_ratio)
  emb_sched = warmup_schedule(cfg.puzzle_emb_lr, cfg.warmup_steps, cfg.total_steps, cfg.lr_min_ratio)
  return optax.multi_transform(
      {ADAM: adam_atan2(sched, cfg.beta1, cfg.beta2, cfg.weight_decay),
       PUZZLE_EMB: sign_sgd(emb_sched, cfg.puzzle_emb_weight_decay)},
      param_labels)
