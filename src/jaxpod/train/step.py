"""The train step: a pure `(state, batch) -> (state, metrics)`, jitted once with shardings and donation.

One call is one loss evaluation of the task and one optimizer update (the task's carry, e.g. TRM's
ACT carry, goes from step to step inside the state). The rng of step
k is `fold_in(state.rng, k)`, so a resumed run draws exactly what an uninterrupted one does.
A task may ask for several updates on each batch (`updates`, GRPO's num_iterations): still one step, one
batch, one checkpointable unit, the updates looped inside the jitted call.

Gradient accumulation (`trainer.microbatches` k): the batch's rows split in k microbatches (microbatch j holds rows
j, j + k, ...: every device keeps its own rows), each one's loss and gradient in a scan, one update. A task's loss
is a mean; `loss_normalizer` names the metric sum it divides by (LM: "tokens"; None: the microbatch's rows), so the
gradients are summed weighted by each microbatch's share of it: the update equals the whole batch's, and only one
microbatch's activations live at a time.

Metrics come back as raw sums (replicated global scalars). The loop reads step N-1's metrics
after dispatching step N (`host_metrics`), so the host never waits on the device in between.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from jaxpod import runtime
from jaxpod.train.state import TrainState, batch_sharding


def ema_update(ema, params, decay: float):
  """ema <- decay * ema + (1 - decay) * params (decay 0: a copy of params)."""
  return jax.tree.map(lambda e, p: decay * e + (1.0 - decay) * p, ema, params)


def train_step_fn(loss_fn: Callable, tx: optax.GradientTransformation, ema_decay: float,
                  lr_fn: Callable | None = None, updates: int = 1, microbatches: int = 1,
                  loss_normalizer: str | None = None):
  """The pure step function (unjitted): the task's loss and grads, one update, EMA, metrics.

  loss_fn: `(params, buffers, batch, rng, carry) -> (loss, (carry, metric sums))` (`Task.loss_fn`).
  updates > 1: that many loss evaluations and optimizer updates on the same batch (`repeated`).
  microbatches > 1: the gradient accumulated over that many microbatches (`accumulated`).
  """
  grad_fn = jax.value_and_grad(loss_fn, argnums=0, has_aux=True)
  if microbatches > 1:
    grad_fn = accumulated(grad_fn, microbatches, loss_normalizer)

  def train_step(state: TrainState, batch: dict) -> tuple[TrainState, dict]:
    rng = jax.random.fold_in(state.rng, state.step)
    with jax.named_scope("loss_and_grads"):
      (_, (carry, metrics)), grads = grad_fn(state.params, state.buffers, batch, rng, state.carry)
    with jax.named_scope("optimizer"):
      updates, opt_state = tx.update(grads, state.opt_state, state.params)
      params = optax.apply_updates(state.params, updates)
      ema = None if state.ema_params is None else ema_update(state.ema_params, params, ema_decay)
    if lr_fn is not None:
      metrics["lr"] = jnp.asarray(lr_fn(state.step), jnp.float32)
    metrics["grad_norm"] = optax.tree.norm(grads)
    new_state = state.replace(params=params, opt_state=opt_state, ema_params=ema, step=state.step + 1, carry=carry)
    return new_state, metrics

  return train_step if updates == 1 else repeated(train_step, updates, lr_fn)


_EXTREMES = {"_max": jnp.maximum, "_min": jnp.minimum}  # metrics that are extremes (GRPO's ratio_max), not sums


def accumulated(grad_fn: Callable, k: int, loss_normalizer: str | None) -> Callable:
  """`grad_fn` (value_and_grad of a task's loss, has_aux) over k microbatches of the batch and the carry, the
  gradients summed in float32, each weighted by its microbatch's share of the normalizer (see the module docstring):
  ((loss, (carry, metric sums)), grads) as of the whole batch."""
  from jaxpod.runtime.sharding import constrain

  def split(x):  # [B, ...] -> [k, B / k, ...]: microbatch j is rows j, j + k, ... (no row leaves its device)
    x = x.reshape(x.shape[0] // k, k, *x.shape[1:]).swapaxes(0, 1)
    return constrain(x, (None, "batch") + (None,) * (x.ndim - 2))

  def join(x):  # the inverse of split
    return x.swapaxes(0, 1).reshape(-1, *x.shape[2:])

  def fn(params, buffers, batch, rng, carry):
    micro, micro_carry = jax.tree.map(split, batch), jax.tree.map(split, carry)
    one = jax.tree.map(lambda x: x[0], (micro, micro_carry))
    (_, (_, like)), _ = jax.eval_shape(lambda b, c: grad_fn(params, buffers, b, rng, c), *one)

    def body(acc, xs):
      grads_sum, loss_sum, weight_sum, sums = acc
      mb, mc, j = xs
      (loss, (mc, metrics)), grads = grad_fn(params, buffers, mb, jax.random.fold_in(rng, j), mc)
      rows = jax.tree.leaves(mb)[0].shape[0]
      w = metrics[loss_normalizer].astype(jnp.float32) if loss_normalizer else jnp.float32(rows)
      grads_sum = jax.tree.map(lambda a, g: a + w * g.astype(jnp.float32), grads_sum, grads)
      sums = {n: _EXTREMES.get(n[-4:], jnp.add)(sums[n], v) for n, v in metrics.items()}
      return (grads_sum, loss_sum + w * loss, weight_sum + w, sums), mc

    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    first = {n: jnp.full(v.shape, -jnp.inf if n.endswith("_max") else jnp.inf if n.endswith("_min") else 0, v.dtype)
             for n, v in like.items()}
    (grads_sum, loss_sum, weight, sums), carries = jax.lax.scan(
        body, (zeros, jnp.float32(0), jnp.float32(0), first), (micro, micro_carry, jnp.arange(k)))
    weight = jnp.maximum(weight, 1e-30)
    grads = jax.tree.map(lambda g, p: (g / weight).astype(p.dtype), grads_sum, params)
    return (loss_sum / weight, (jax.tree.map(join, carries), sums)), grads

  return fn


def repeated(train_step: Callable, updates: int, lr_fn: Callable | None) -> Callable:
  """`train_step` applied `updates` times to one batch as one step: the state's step (and rng, checkpoints,
  hooks) advances once, the optimizer's count (and lr schedule) and the EMA `updates` times; metrics are the mean of the
  updates' sums (so `normalize` reads per update), a `*_max` / `*_min` the extreme over them, lr the first's."""
  def step(state: TrainState, batch: dict) -> tuple[TrainState, dict]:
    def body(s, i):
      s, metrics = train_step(s.replace(rng=jax.random.fold_in(state.rng, i)), batch)
      return s.replace(step=state.step), metrics
    new, metrics = jax.lax.scan(body, state, jnp.arange(updates))
    reduce = {"_max": jnp.max, "_min": jnp.min}  # extremes (e.g. GRPO's ratio_max) over the updates, sums averaged
    metrics = {k: reduce.get(k[-4:], jnp.mean)(m, axis=0) for k, m in metrics.items()}
    if lr_fn is not None:
      metrics["lr"] = jnp.asarray(lr_fn(state.step * updates), jnp.float32)
    return new.replace(step=state.step + 1, rng=state.rng), metrics
  return step


def batch_shardings(mesh, ndims: dict) -> dict:
  """Batch arrays ({name: ndim}) split over the data-parallel axes on their leading (row) axis."""
  return {k: batch_sharding(mesh, ndim) for k, ndim in ndims.items()}


def jit_train_step(step_fn, shardings: TrainState, batch_sh: dict, mesh):
  """`runtime.jit` with explicit in/out shardings and the state donated."""
  replicated = NamedSharding(mesh, PartitionSpec())
  return runtime.jit(step_fn, name="train_step", in_shardings=(shardings, batch_sh),
                     out_shardings=(shardings, replicated), donate_argnums=(0,))


def global_batch(local: dict, shardings: dict) -> dict:
  """This host's rows (numpy) -> global jax.Arrays; hosts' slices are contiguous along the data axis.

  Floating arrays (e.g. RL advantages, behaviour log-probs) stay float32; everything else is int32."""
  def cast(v):
    v = np.asarray(v)
    return v.astype(np.float32) if np.issubdtype(v.dtype, np.floating) else v.astype(np.int32)
  return {k: jax.make_array_from_process_local_data(shardings[k], cast(v)) for k, v in local.items() if k in shardings}


def host_metrics(metrics: dict) -> dict:
  """Replicated device scalars -> Python numbers (blocks until the step that made them is done)."""
  return {k: np.asarray(v.addressable_data(0)).item() for k, v in metrics.items()}
