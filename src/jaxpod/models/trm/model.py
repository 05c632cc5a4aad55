"""The TRM network (Flax NNX) and its ACT step as a pure function.

Hot-loop use: split once, then jit the pure functions.
    graphdef, params, buffers = split_model(model)
    carry = init_carry(cfg, batch_size)
    carry, outputs = act_step(graphdef, params, buffers, carry, batch, rng, train=True)
`params` holds every `nnx.Param` (the puzzle-embedding table included, as `PuzzleEmbedding`);
`buffers` holds H_init / L_init (never trained).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from jaxpod.models.trm.config import TRMConfig
from jaxpod.models.trm.layers import Block, Buffer, PuzzleEmbedding, param, rope_tables, trunc_normal
from jaxpod.runtime import constrain

Batch = dict  # {"inputs": int32[B, S], "labels": int32[B, S], "puzzle_identifiers": int32[B]}
BATCH_KEYS = ("inputs", "labels", "puzzle_identifiers")


class TRM(nnx.Module):
  """Tiny Recursive Model: embeddings, one shared `l_layers`-block network, lm and q heads."""

  def __init__(self, cfg: TRMConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    d = cfg.hidden_size
    std = 1 / math.sqrt(d)
    self.embed_tokens = param(rngs, (cfg.vocab_size, d), std, ("vocab", "embed"))
    if cfg.pos_encodings == "learned":
      self.embed_pos = param(rngs, (cfg.total_seq_len, d), std, ("positions", "embed"))
    if cfg.puzzle_emb_ndim > 0:
      table = jnp.zeros((cfg.num_puzzle_identifiers, cfg.puzzle_emb_ndim), jnp.float32)
      self.puzzle_emb = PuzzleEmbedding(table, logical_axes=("puzzle_ids", "embed"))
    self.layers = nnx.List([Block(cfg, rngs=rngs) for _ in range(cfg.l_layers)])
    self.lm_head = param(rngs, (d, cfg.vocab_size), std, ("embed", "vocab"))
    self.q_head = nnx.Param(jnp.zeros((d, 2), jnp.float32), logical_axes=("embed", None))
    self.q_head_bias = nnx.Param(jnp.full((2,), -5.0, jnp.float32), logical_axes=(None,))
    self.H_init = Buffer(trunc_normal(rngs.params(), (d,), 1.0), logical_axes=("embed",))
    self.L_init = Buffer(trunc_normal(rngs.params(), (d,), 1.0), logical_axes=("embed",))

  @property
  def dtype(self):
    return jnp.dtype(self.cfg.compute_dtype)

  def input_embeddings(self, inputs_BxS, puzzle_ids_B):
    """Token embeddings with the puzzle prefix in front, times sqrt(hidden): [B, T, D]."""
    cfg, dtype = self.cfg, self.dtype
    x_BxSxD = self.embed_tokens[...].astype(dtype)[inputs_BxS]
    if cfg.puzzle_emb_ndim > 0:
      rows_BxP = self.puzzle_emb[...][puzzle_ids_B].astype(dtype)
      pad = cfg.prefix_len * cfg.hidden_size - cfg.puzzle_emb_ndim
      prefix = jnp.pad(rows_BxP, ((0, 0), (0, pad))).reshape(-1, cfg.prefix_len, cfg.hidden_size)
      x_BxSxD = jnp.concatenate([prefix, x_BxSxD], axis=1)  # [B, T, D]
    if cfg.pos_encodings == "learned":
      x_BxSxD = 0.707106781 * (x_BxSxD + self.embed_pos[...].astype(dtype))
    return constrain(cfg.embed_scale * x_BxSxD, ("batch", "seq", "act_embed"))

  def cos_sin(self):
    if self.cfg.pos_encodings == "rope" and not self.cfg.mlp_t:
      return rope_tables(self.cfg)
    return None

  def l_level(self, h_BxTxD, injection_BxTxD, cos_sin):
    """The shared network: blocks applied to h + injection."""
    x = h_BxTxD + injection_BxTxD
    for block in self.layers:
      x = block(x, cos_sin)
    return x

  def cycle(self, z_H, z_L, x, cos_sin):
    """One H cycle: l_cycles z_L updates, then one z_H update."""
    for _ in range(self.cfg.l_cycles):
      z_L = self.l_level(z_L, z_H + x, cos_sin)
    z_H = self.l_level(z_H, z_L, cos_sin)
    return z_H, z_L

  def heads(self, z_H_BxTxD):
    """(logits [B, S, V] without the prefix, q_halt [B], q_continue [B]), q in fp32."""
    dtype = self.dtype
    logits = jnp.einsum("btd,dv->btv", z_H_BxTxD[:, self.cfg.prefix_len:], self.lm_head[...].astype(dtype))
    q = z_H_BxTxD[:, 0] @ self.q_head[...].astype(dtype) + self.q_head_bias[...].astype(dtype)
    q = q.astype(jnp.float32)
    return logits, q[..., 0], q[..., 1]


class TRMCarry(NamedTuple):
  """ACT state between steps; rows with `halted` are reset and take new data at the next step."""

  z_H: jax.Array  # [B, T, D] compute dtype
  z_L: jax.Array  # [B, T, D] compute dtype
  steps: jax.Array  # int32 [B]
  halted: jax.Array  # bool [B]
  current_data: dict  # the batch rows each slot is working on (BATCH_KEYS)


def split_model(model: TRM):
  """(graphdef, params, buffers): call once, outside the hot loop."""
  return nnx.split(model, nnx.Param, Buffer)


def init_carry(cfg: TRMConfig, batch_size: int) -> TRMCarry:
  """A carry whose rows are all halted, so the first step resets every row and takes the batch."""
  shape = (batch_size, cfg.total_seq_len, cfg.hidden_size)
  data = {"inputs": jnp.zeros((batch_size, cfg.seq_len), jnp.int32),
          "labels": jnp.zeros((batch_size, cfg.seq_len), jnp.int32),
          "puzzle_identifiers": jnp.zeros((batch_size,), jnp.int32)}
  # Distinct buffers (not one zeros array twice), so the carry can be donated to a jitted step.
  return TRMCarry(jnp.zeros(shape, cfg.compute_dtype), jnp.zeros(shape, cfg.compute_dtype),
                  jnp.zeros((batch_size,), jnp.int32), jnp.ones((batch_size,), bool), data)


def _where_rows(mask_B, a, b):
  return jnp.where(mask_B.reshape((-1,) + (1,) * (a.ndim - 1)), a, b)


def reset_carry(model: TRM, carry: TRMCarry, batch: Batch) -> TRMCarry:
  """Halted rows: z = H_init/L_init, steps = 0, data from `batch`; running rows keep theirs."""
  h = carry.halted
  dtype = model.dtype
  z_H = _where_rows(h, model.H_init[...].astype(dtype)[None, None, :], carry.z_H)
  z_L = _where_rows(h, model.L_init[...].astype(dtype)[None, None, :], carry.z_L)
  data = {k: _where_rows(h, batch[k].astype(v.dtype), v) for k, v in carry.current_data.items()}
  return TRMCarry(z_H, z_L, jnp.where(h, 0, carry.steps), h, data)


def forward(model: TRM, no_grad_model: TRM, z_H, z_L, data: Batch):
  """The inner step: h_cycles-1 cycles without gradient (run by `no_grad_model`), one with."""
  cfg = model.cfg
  cos_sin = model.cos_sin()
  x = model.input_embeddings(data["inputs"], data["puzzle_identifiers"])
  if cfg.h_cycles > 1:
    x_ng = jax.lax.stop_gradient(x)
    with jax.named_scope("trm_no_grad_cycles"):
      z_H, z_L = jax.lax.fori_loop(
          0, cfg.h_cycles - 1, lambda _, zs: no_grad_model.cycle(*zs, x_ng, cos_sin), (z_H, z_L))
    z_H, z_L = jax.lax.stop_gradient((z_H, z_L))
  with jax.named_scope("trm_grad_cycle"):
    z_H, z_L = model.cycle(z_H, z_L, x, cos_sin)
  logits, q_halt, q_continue = model.heads(z_H)
  return jax.lax.stop_gradient(z_H), jax.lax.stop_gradient(z_L), logits, q_halt, q_continue


def _halting(cfg: TRMConfig, steps_B, q_halt_B, rng, train: bool):
  halted = steps_B >= cfg.halt_max_steps
  if train and cfg.halt_max_steps > 1:
    halted = halted | (q_halt_B > 0)
    if cfg.halt_exploration_prob > 0:
      if rng is None:
        raise ValueError("act_step(train=True) needs an rng when halt_exploration_prob > 0")
      k_explore, k_min = jax.random.split(rng)
      explore = jax.random.uniform(k_explore, steps_B.shape) < cfg.halt_exploration_prob
      min_steps = jax.random.randint(k_min, steps_B.shape, 2, cfg.halt_max_steps + 1)
      halted = halted & (steps_B >= jnp.where(explore, min_steps, 0))
  return halted


def act_step(graphdef, params, buffers, carry: TRMCarry, batch: Batch, rng, train: bool):
  """One ACT step (pure, jit-friendly): reset halted rows, recurse, decide halting.

  Returns (new_carry, outputs) with outputs = {logits [B, S, V], q_halt_logits [B], q_continue_logits [B]}.
  Only `params` receive gradients, and only through the last H cycle. `train` is a Python bool
  (static under jit); `rng` is a key for halting exploration (None is fine in eval or with p = 0).
  """
  model = nnx.merge(graphdef, params, buffers)
  no_grad_model = nnx.merge(graphdef, jax.lax.stop_gradient(params), buffers)
  cfg = model.cfg
  carry = reset_carry(model, carry, batch)
  z_H, z_L, logits, q_halt, q_continue = forward(model, no_grad_model, carry.z_H, carry.z_L, carry.current_data)
  steps = carry.steps + 1
  halted = _halting(cfg, steps, jax.lax.stop_gradient(q_halt), rng, train)
  outputs = {"logits": logits, "q_halt_logits": q_halt, "q_continue_logits": q_continue}
  return TRMCarry(z_H, z_L, steps, halted, carry.current_data), outputs
