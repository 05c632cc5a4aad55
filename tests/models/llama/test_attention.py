"""Attention over a call's own keys in query blocks (`models/llama/attention.py`): the plain form's result."""
import jax.numpy as jnp
import numpy as np

from jaxpod.models.llama import attention


def test_query_blocks_give_the_full_square_result_with_padding_and_a_window():
  """Blocks of 16 query rows, each scored against the keys up to its last row only, give the context the [T, T] form
  gives (one block) under a causal + padding + sliding-window mask, GQA 2 x 2, to float32 summation order."""
  rng = np.random.default_rng(0)
  b, t, k, g, e = 2, 50, 2, 2, 8
  shapes = ((b, t, k, g, e), (b, k, t, e), (b, k, t, e))
  q, keys, values = (jnp.asarray(rng.normal(size=s), jnp.float32) for s in shapes)
  slots = np.arange(t)
  pad = np.ones((b, t), bool)
  pad[1, 40:] = False  # row 1: ten padding keys at the end
  mask = (slots[None, None, :] <= slots[None, :, None]) & pad[:, None, :] & (slots[:, None] - slots[None, :] < 20)
  whole = attention.attend_own_keys(q, keys, values, jnp.asarray(mask), 0.35, block=t)
  blocked = attention.attend_own_keys(q, keys, values, jnp.asarray(mask), 0.35, block=16)
  assert blocked.shape == (b, t, k, g, e)
  np.testing.assert_allclose(np.asarray(blocked), np.asarray(whole), atol=2e-6)


def test_block_size_grows_with_the_call_and_short_calls_are_one_block():
  """Below 2 x 64 new tokens one block (decode, the short RL rows); then 64 rows, and at most 8 blocks."""
  assert [attention.query_block(t) for t in (1, 40, 127, 128, 303, 512, 4096)] == [1, 40, 127, 64, 64, 64, 512]

