"""AdamW's weight decay shrinks the matrices only: never a norm weight, never a bias (Qwen2's q/k/v)."""
import dataclasses

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxpod.models.llama import tiny
from jaxpod.models.llama.model import Llama, weight_decay_mask


def test_a_decaying_step_moves_matrices_and_leaves_biases_and_norms():
  cfg = dataclasses.replace(tiny(), model_type="qwen2", qkv_bias=True)
  params = nnx.split(Llama(cfg, rngs=nnx.Rngs(params=0)))[1]
  params = jax.tree.map(lambda x: x + 0.5, params)  # every bias and norm weight non-zero: decay would show
  tx = optax.adamw(1e-1, weight_decay=0.5, mask=weight_decay_mask)
  zero = jax.tree.map(jnp.zeros_like, params)
  updates, _ = tx.update(zero, tx.init(params), params)
  moved = {jax.tree_util.keystr(p): bool(jnp.any(u != 0)) for p, u in jax.tree_util.tree_leaves_with_path(updates)}
  biases = [k for k in moved if "bias" in k]
  norms = [k for k in moved if "norm" in k]
  matrices = [k for k in moved if k not in biases and k not in norms]
  assert len(biases) == 3 and norms and matrices  # q, k, v biases, each stacked [L, ...] over the layers
  assert not any(moved[k] for k in biases + norms)
  assert all(moved[k] for k in matrices)
