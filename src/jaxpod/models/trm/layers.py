"""TRM building blocks: init, scale-free RMSNorm, RoPE, SwiGLU, attention and the post-norm block.

Shapes: B batch, T positions (prefix + tokens), D hidden, H heads, E head_dim, F SwiGLU width.
Kernels are stored [in, out] (the reference stores [out, in]; `interop` transposes).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from jaxpod.models.trm.config import TRMConfig, swiglu_width
from jaxpod.runtime import constrain


class Buffer(nnx.Variable):
  """A persistent, untrained array (the reference's `nn.Buffer`, e.g. H_init / L_init)."""


class PuzzleEmbedding(nnx.Param):
  """The puzzle-embedding table: differentiable, but trained by SignSGD, not AdamATan2."""


def _trunc_normal_comp() -> float:
  # The reference's trunc_normal_init_ rescales so the truncated (+-2 sigma) draw has std exactly `std`.
  z = math.erf(2 / math.sqrt(2))
  pdf = math.exp(-2.0) / math.sqrt(2 * math.pi)
  return 1.0 / math.sqrt(1 - 4 * pdf / z)


_TRUNC_COMP = _trunc_normal_comp()


def trunc_normal(key, shape, std: float, dtype=jnp.float32):
  """Truncated normal on [-2, 2] standard deviations, std-compensated as the reference init."""
  if std == 0:
    return jnp.zeros(shape, dtype)
  return (jax.random.truncated_normal(key, -2.0, 2.0, shape, jnp.float32) * (std * _TRUNC_COMP)).astype(dtype)


def param(rngs: nnx.Rngs, shape, std: float, axes) -> nnx.Param:
  """A trainable fp32 parameter with its logical axes."""
  return nnx.Param(trunc_normal(rngs.params(), shape, std), logical_axes=tuple(axes))


def rms_norm(x, eps: float):
  """Scale-free RMSNorm over the last axis, in fp32, cast back."""
  x32 = x.astype(jnp.float32)
  var = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
  return (x32 * jax.lax.rsqrt(var + eps)).astype(x.dtype)


def rope_tables(cfg: TRMConfig):
  """(cos, sin) [T, E] for positions 0..T-1 (prefix included), halves repeated (`rotate_half` layout)."""
  dim = cfg.head_dim
  inv_freq = 1.0 / (jnp.float32(cfg.rope_theta) ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
  t = jnp.arange(cfg.total_seq_len, dtype=jnp.float32)
  freqs = jnp.outer(t, inv_freq)
  emb = jnp.concatenate([freqs, freqs], axis=-1)
  return jnp.cos(emb), jnp.sin(emb)


def _apply_rope(x_BxTxHxE, cos_TxE, sin_TxE):
  x = x_BxTxHxE.astype(jnp.float32)
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  out = x * cos_TxE[None, :, None, :] + rotated * sin_TxE[None, :, None, :]
  return out.astype(x_BxTxHxE.dtype)


class SwiGLU(nnx.Module):
  """down(silu(gate) * up) over the last axis, with one fused gate/up kernel [dim, 2, F]."""

  def __init__(self, dim: int, expansion: float, dim_axis: str, *, rngs: nnx.Rngs):
    inter = swiglu_width(dim, expansion)
    self.gate_up = param(rngs, (dim, 2, inter), 1 / math.sqrt(dim), (dim_axis, None, "mlp"))
    self.down = param(rngs, (inter, dim), 1 / math.sqrt(inter), ("mlp", dim_axis))

  def __call__(self, x_BxSxI):
    dtype = x_BxSxI.dtype
    gu_BxSx2xF = jnp.einsum("bsi,ikf->bskf", x_BxSxI, self.gate_up[...].astype(dtype))
    h_BxSxF = jax.nn.silu(gu_BxSx2xF[:, :, 0]) * gu_BxSx2xF[:, :, 1]
    return jnp.einsum("bsf,fi->bsi", h_BxSxF, self.down[...].astype(dtype))


class Attention(nnx.Module):
  """Non-causal multi-head attention, one bias-free qkv kernel [D, 3, H, E], RoPE on q and k."""

  def __init__(self, cfg: TRMConfig, *, rngs: nnx.Rngs):
    d, h, e = cfg.hidden_size, cfg.num_heads, cfg.head_dim
    self.qkv = param(rngs, (d, 3, h, e), 1 / math.sqrt(d), ("embed", None, "heads", "head_dim"))
    self.o = param(rngs, (h, e, d), 1 / math.sqrt(h * e), ("heads", "head_dim", "embed"))

  def __call__(self, x_BxTxD, cos_sin):
    dtype = x_BxTxD.dtype
    qkv = jnp.einsum("btd,dkhe->btkhe", x_BxTxD, self.qkv[...].astype(dtype))
    q_BxTxHxE, k_BxTxHxE, v_BxTxHxE = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    if cos_sin is not None:
      q_BxTxHxE = _apply_rope(q_BxTxHxE, *cos_sin)
      k_BxTxHxE = _apply_rope(k_BxTxHxE, *cos_sin)
    scale = 1.0 / math.sqrt(q_BxTxHxE.shape[-1])
    s_BxHxTxT = jnp.einsum("bqhe,bkhe->bhqk", q_BxTxHxE, k_BxTxHxE, preferred_element_type=jnp.float32) * scale
    p_BxHxTxT = jax.nn.softmax(s_BxHxTxT, axis=-1).astype(dtype)
    o_BxTxHxE = jnp.einsum("bhqk,bkhe->bqhe", p_BxHxTxT, v_BxTxHxE)
    return jnp.einsum("bqhe,hed->bqd", o_BxTxHxE, self.o[...].astype(dtype))


class Block(nnx.Module):
  """Post-norm block: h = rms(h + mix(h)); h = rms(h + SwiGLU(h)).

  With `mlp_t` the mixer is a SwiGLU across positions applied to [B, D, T], and its residual
  + norm happen in that layout, so that norm is over positions (as the reference does).
  """

  def __init__(self, cfg: TRMConfig, *, rngs: nnx.Rngs):
    self.eps = cfg.rms_norm_eps
    self.use_mlp_t = cfg.mlp_t
    if cfg.mlp_t:
      self.mlp_t = SwiGLU(cfg.total_seq_len, cfg.expansion, "positions", rngs=rngs)
    else:
      self.self_attn = Attention(cfg, rngs=rngs)
    self.mlp = SwiGLU(cfg.hidden_size, cfg.expansion, "embed", rngs=rngs)

  def __call__(self, x_BxTxD, cos_sin):
    if self.use_mlp_t:
      xt_BxDxT = constrain(jnp.swapaxes(x_BxTxD, 1, 2), ("batch", "act_embed", "seq"))
      xt_BxDxT = rms_norm(xt_BxDxT + self.mlp_t(xt_BxDxT), self.eps)
      x_BxTxD = jnp.swapaxes(xt_BxDxT, 1, 2)
    else:
      x_BxTxD = rms_norm(x_BxTxD + self.self_attn(x_BxTxD, cos_sin), self.eps)
    x_BxTxD = constrain(x_BxTxD, ("batch", "seq", "act_embed"))
    x_BxTxD = rms_norm(x_BxTxD + self.mlp(x_BxTxD), self.eps)
    return constrain(x_BxTxD, ("batch", "seq", "act_embed"))
