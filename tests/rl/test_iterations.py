"""`grpo.num_iterations` (TRL's num_iterations, GRPO's mu): several optimizer updates on each rollout batch inside
one trainer step, the ratio's pi_old the engine's behaviour log-probs throughout."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpod.rl import grpo


def _setup(tmp_path, *flags):
  """(task, graphdef, a fresh TrainState, the run's RolloutConfig) of the TINY config with `flags`, no jitted init."""
  import draccus
  from jaxpod.rl.config import RLConfig
  from jaxpod.policy.spec import PolicySpec
  from jaxpod.rl.grpo_task import GRPOTask
  from jaxpod.rl.run import grpo_config
  from jaxpod.train.state import TrainState
  from tests.rl.clusters import TINY
  cfg = draccus.parse(RLConfig, args=[*TINY, *flags])
  task = GRPOTask(grpo_config(cfg, str(tmp_path), PolicySpec(cfg.model)), source=None)  # a random start, no batches
  graphdef, shapes, buffers = task.abstract_model(0)
  rng = np.random.default_rng(6)
  params = jax.tree.map(lambda x: jnp.asarray(rng.normal(0, 0.1, x.shape).astype(x.dtype)), shapes)
  tx, _ = task.optimizer()
  state = TrainState(params=params, buffers=buffers, opt_state=tx.init(params), ema_params=None,
                     step=jnp.zeros([], jnp.int32), rng=jax.random.PRNGKey(0), carry=())
  return task, graphdef, state, cfg.rollout


def _step(task, graphdef, updates):
  from jaxpod.train.step import train_step_fn
  tx, lr_fn = task.optimizer()
  return jax.jit(train_step_fn(task.loss_fn(graphdef), tx, 0.0, lr_fn, updates))


def _on_policy_batch(graphdef, params, rollout, seed):
  """Rows whose behaviour log-probs are the params' own (what the engine records): the first update's ratio is 1."""
  from flax import nnx
  rng = np.random.default_rng(seed)
  rows, length = 8, rollout.max_prompt_len + rollout.max_new_tokens
  tokens = rng.integers(0, 256, (rows, length)).astype(np.int32)
  loss_mask = np.zeros((rows, length), np.int32)
  loss_mask[:, 8:length - 1] = 1
  logp = grpo.token_logprobs(nnx.merge(graphdef, params)(tokens[:, :-1]).logits, tokens[:, 1:], rollout.sampling())
  return {"tokens": tokens, "loss_mask": loss_mask, "behaviour": jnp.pad(logp, ((0, 0), (0, 1))),
          "advantages": jnp.asarray(rng.normal(size=rows), jnp.float32), "reward": jnp.ones(rows),
          "correct": jnp.ones(rows)}


def test_one_iteration_is_one_plain_update_of_the_tasks_loss(tmp_path):
  """The default for full fine-tuning (num_iterations 0: 1 without LoRA) is today's step: params after it are one
  AdamW update of the loss's grads."""
  import optax
  task, graphdef, state, rollout = _setup(tmp_path)
  assert task.updates_per_batch == 1
  tx, _ = task.optimizer()
  step = _step(task, graphdef, 1)
  for k in range(3):  # past the first step, whose lr is 0 (warm-up)
    batch = _on_policy_batch(graphdef, state.params, rollout, k)
    grads = jax.jit(jax.grad(lambda p: task.loss_fn(graphdef)(p, state.buffers, batch, None, ())[0]))(state.params)
    updates, _ = tx.update(grads, state.opt_state, state.params)
    want = optax.apply_updates(state.params, updates)
    state, metrics = step(state, batch)
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(state.params)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)
  assert int(state.step) == 3 and float(metrics["ratio_sum"] / metrics["tokens"]) == pytest.approx(1.0, abs=1e-5)


def test_two_iterations_are_two_updates_on_one_batch_in_one_step(tmp_path):
  """Invariants 5 and 9 rest on it: num_iterations 2 takes two updates on the same batch (the second's ratio is
  off 1, against the same behaviour log-probs), yet the trainer's step (checkpoints, versions, resume) counts one
  batch; the lr warm-up spans the same 5 batches (10 updates)."""
  task, graphdef, state, rollout = _setup(tmp_path, "--grpo.num_iterations", "2")
  assert task.updates_per_batch == 2
  twice, once = _step(task, graphdef, 2), _step(task, graphdef, 1)
  ref = state
  for k in range(3):
    batch = _on_policy_batch(graphdef, state.params, rollout, k)
    state, metrics = twice(state, batch)
    one, first = once(ref, batch)
    ref, second = once(one.replace(step=ref.step), batch)  # the same batch again, at the same step
    ref = ref.replace(step=state.step)
    for a, b in zip(jax.tree.leaves(ref.params), jax.tree.leaves(state.params)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)
  assert int(state.step) == 3
  _, lr_fn = task.optimizer()
  assert float(metrics["lr"]) == pytest.approx(float(lr_fn(4)))  # the batch's first update: the 5th of 10 warm-up
  ratio = {name: float(m["ratio_sum"] / m["tokens"]) for name, m in (("first", first), ("second", second))}
  assert ratio["first"] == pytest.approx(1.0, abs=1e-5) and abs(ratio["second"] - 1.0) > 1e-4, ratio
  assert float(metrics["ratio_sum"]) == pytest.approx((float(first["ratio_sum"]) + float(second["ratio_sum"])) / 2,
                                                      rel=1e-5)  # logged: the mean of the batch's updates
  extreme = max(float(first["ratio_max"]), float(second["ratio_max"]))
  assert float(metrics["ratio_max"]) == pytest.approx(extreme)  # a *_max: the largest of the updates', not their mean
  moved_once = jax.tree.leaves(one.params)
  assert any(not np.allclose(a, b) for a, b in zip(moved_once, jax.tree.leaves(state.params)))


def test_the_default_is_two_updates_per_batch_with_lora_and_one_without():
  """num_iterations 0 (the default) resolves by the policy: LoRA adapters take 2 updates per batch (docs/lora.md:
  8-20 points more on the same samples at rank 1 and 16), full fine-tuning 1; a value given is kept either way."""
  from jaxpod.rl.config import GRPOConfig
  assert GRPOConfig().num_iterations == 0
  assert (GRPOConfig().updates_per_batch(lora=True), GRPOConfig().updates_per_batch(lora=False)) == (2, 1)
  assert GRPOConfig(num_iterations=3).updates_per_batch(lora=True) == 3
  assert GRPOConfig(num_iterations=3).updates_per_batch(lora=False) == 3


def test_bad_num_iterations_is_one_line_before_jax(capsys, tmp_path):
  """Invariant 7: num_iterations < 0 fails in one line naming the field, before JAX starts."""
  from jaxpod.cli.main import main
  code = main(["rl", "--trainer.runs_dir", str(tmp_path / "runs"), "--grpo.num_iterations", "-1"])
  err = capsys.readouterr().err.strip()
  assert code == 2 and "rl.grpo.num_iterations=-1 must be >= 1" in err and len(err.splitlines()) == 1, err
