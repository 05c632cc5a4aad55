"""Gradient accumulation (`trainer.microbatches`): k microbatches in one step give the whole batch's update, for a
loss that is a mean over tokens (weighted by each microbatch's tokens) and one that is a mean over rows; the
microbatch count is checked against the rows before JAX starts."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxpod.models.llama import init, tiny
from jaxpod.models.llama.loss import next_token_loss
from jaxpod.train.state import TrainState
from jaxpod.train.step import train_step_fn

CFG = tiny(num_hidden_layers=2, vocab_size=64)


def _state(tx):
  graphdef, params = nnx.split(init(CFG, seed=1))
  return graphdef, TrainState(params=params, buffers={}, opt_state=tx.init(params), ema_params=None,
                              step=jnp.zeros([], jnp.int32), rng=jax.random.PRNGKey(0), carry=())


def _batch():
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, CFG.vocab_size, (8, 13)).astype(np.int32)
  lengths = np.array([13, 3, 9, 13, 5, 2, 11, 7])  # ragged rows: each microbatch holds its own token count
  mask = (np.arange(13)[None, :] < lengths[:, None]).astype(np.int32)
  return {"tokens": jnp.asarray(tokens), "mask": jnp.asarray(mask)}


def _token_mean(graphdef):
  def loss(params, buffers, batch, rng, carry):
    value, sums = next_token_loss(graphdef, params, batch["tokens"], batch["mask"] > 0)
    return value, (carry, {"loss_sum": sums["loss_sum"], "tokens": sums["tokens"].astype(jnp.float32)})
  return loss


def _row_mean(graphdef):
  def loss(params, buffers, batch, rng, carry):
    first = nnx.merge(graphdef, params)(batch["tokens"][:, :4]).logits[:, -1]  # [B, V]: one score per row
    per_row = jax.nn.logsumexp(first, axis=-1) - first[:, 0]
    return jnp.mean(per_row), (carry, {"row_loss_sum": jnp.sum(per_row), "first_max": jnp.max(per_row)})
  return loss


@pytest.mark.parametrize("loss, normalizer", [(_token_mean, "tokens"), (_row_mean, None)])
def test_microbatches_give_the_whole_batchs_update_and_metrics(loss, normalizer):
  tx = optax.sgd(1.0)  # the update is the gradient itself (Adam's first step would amplify rounding in tiny ones)
  graphdef, state = _state(tx)
  batch = _batch()
  start = jax.tree.leaves(state.params)
  whole = jax.jit(train_step_fn(loss(graphdef), tx, 0.0))(state, batch)
  for k in (2, 4):
    split = jax.jit(train_step_fn(loss(graphdef), tx, 0.0, microbatches=k, loss_normalizer=normalizer))(state, batch)
    for p, a, b in zip(start, jax.tree.leaves(whole[0].params), jax.tree.leaves(split[0].params)):
      want, got = np.asarray(a) - np.asarray(p), np.asarray(b) - np.asarray(p)
      np.testing.assert_allclose(got, want, atol=1e-6 * max(1.0, float(np.abs(want).max())), rtol=1e-4)
    assert set(split[1]) == set(whole[1])
    for name in whole[1]:  # sums add up, a `_max` is the largest, the gradient's norm is the whole batch's
      np.testing.assert_allclose(float(split[1][name]), float(whole[1][name]), rtol=2e-5, err_msg=name)


def test_unweighted_microbatches_would_differ():
  """The weighting matters: the same microbatches averaged as equals (as rows) miss the whole batch's update."""
  tx = optax.sgd(1.0)
  graphdef, state = _state(tx)
  batch = _batch()
  whole = jax.jit(train_step_fn(_token_mean(graphdef), tx, 0.0))(state, batch)[0].params
  equal = jax.jit(train_step_fn(_token_mean(graphdef), tx, 0.0, microbatches=4, loss_normalizer=None))(state, batch)
  gap = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(whole), jax.tree.leaves(equal[0].params)))
  assert gap > 1e-4


def test_a_microbatch_count_that_does_not_divide_the_rows_is_one_line(tmp_path):
  from jaxpod.runtime.hosts import HostInfo
  from jaxpod.train.config import TrainConfig, TrainerConfig, validate_for_hosts
  cfg = TrainConfig(trainer=TrainerConfig(microbatches=3))
  host = HostInfo(process_index=0, process_count=1, devices_per_host=None)
  with pytest.raises(ValueError, match=r"trainer\.microbatches=3 does not divide"):
    validate_for_hosts(cfg, host)
  with pytest.raises(ValueError, match=r"trainer\.microbatches=0"):
    TrainerConfig(microbatches=0)
