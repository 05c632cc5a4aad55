"""Per-token log-probs of the Llama decoder without its [B, T, V] logits, and the next-token (causal LM) loss.

    logp_BxT = token_logps(graphdef, params, inputs_BxT, targets_BxT)          # log softmax(logits)[target]
    loss, sums = next_token_loss(graphdef, params, tokens_BxT, mask_BxT)       # what a causal-LM train step takes

Every training loss of jaxpod (causal LM, the preference losses, GRPO) reads its model through `token_logps`: the
decoder runs to the final-normed hidden [B, T, D], then the vocab head and the log-prob run by chunks, so no
[B, T, V] float32 logits exist. Why: Llama-3's vocabulary is 128,256, so one 4096-token row's float32 logits are
2 GiB, and their log-softmax and its gradient as much again; compiled for v5p they were ~6 GiB of the 8B train
step's 59.7 GiB per chip.

  vocab chunks      (`vocab_logps`, the log-softmax of logits / temperature: causal LM, preference, GRPO without a
                    top-k / top-p filter) `VOCAB_CHUNKS` slices of the vocabulary in a scan with an online logsumexp
                    and a hand-written backward pass: each slice's head weight is gathered over fsdp, and its
                    gradient reduce-scattered, inside the loop, so neither the whole [D, V] head nor its [D, V]
                    gradient is ever held whole (the gradient of a position-chunked head is a [D, V] float32 sum).
  position chunks   (`chunked_logps`, any log-prob of the whole logits, e.g. the sampler's filtered distribution)
                    `CHUNK` positions at a time, each chunk recomputed in the backward pass.
"""
from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp

from jaxpod.models.llama.model import head_logits
from jaxpod.runtime.sharding import constrain

CHUNK = 128  # positions per chunk of the vocab head ([B, 128, V] float32 logits at a time)
VOCAB_SLICE = 8192  # vocabulary entries per slice of `vocab_logps` (about: the vocab splits in equal slices)


def target_logps(logits_BxCxV, targets_BxC):
  """log softmax(logits)[target] in float32 [B, C]: the target's logit minus a logsumexp (no [B, C, V] log-softmax)."""
  logits = logits_BxCxV.astype(jnp.float32)
  at = jnp.take_along_axis(logits, targets_BxC[..., None].astype(jnp.int32), axis=-1)[..., 0]
  return at - jax.nn.logsumexp(logits, axis=-1)


def chunked_logps(h_BxTxD, w_DxV, targets_BxT, logp: Callable = target_logps, chunk: int = CHUNK):
  """logp(h @ w, targets) float32 [B, T], `chunk` positions at a time in a scan (each chunk's logits recomputed in
  the backward pass); T is padded to a multiple of the chunk and the padding cut off."""
  b, t, d = h_BxTxD.shape
  c = max(1, min(chunk, t))
  n = -(-t // c)
  pad = n * c - t
  if pad:
    h_BxTxD = jnp.pad(h_BxTxD, ((0, 0), (0, pad), (0, 0)))
    targets_BxT = jnp.pad(targets_BxT, ((0, 0), (0, pad)))
  h_NxBxCxD = h_BxTxD.reshape(b, n, c, d).swapaxes(0, 1)
  t_NxBxC = targets_BxT.reshape(b, n, c).swapaxes(0, 1)

  @jax.checkpoint
  def piece(h_BxCxD, t_BxC):
    return logp(head_logits(h_BxCxD, w_DxV), t_BxC)

  if n == 1:
    out_BxT = piece(h_NxBxCxD[0], t_NxBxC[0])
  else:
    _, out_NxBxC = jax.lax.scan(lambda carry, xs: (carry, piece(*xs)), None, (h_NxBxCxD, t_NxBxC))
    out_BxT = out_NxBxC.swapaxes(0, 1).reshape(b, n * c)
  return out_BxT[:, :t]


def _vocab_slices(w_DxV, n: int):
  """The head [D, V] as n slices [n, D, C] (C = ceil(V / n), zero-padded): slice j holds vocab ids j, j + n, ...
  (strided, so a vocabulary split over `model` splits every slice the same way)."""
  d, v = w_DxV.shape
  c = -(-v // n)
  return jnp.pad(w_DxV, ((0, 0), (0, n * c - v))).reshape(d, c, n).transpose(2, 0, 1)


def _slice_logits(h_BxTxD, w_DxC, j, n: int, vocab: int, temperature: float):
  """float32 logits / temperature [B, T, C] of slice j (the head slice gathered over fsdp here, in the loop), padded
  ids at -inf."""
  w_DxC = constrain(w_DxC, ("act_embed", "vocab"))
  logits = head_logits(h_BxTxD, w_DxC) / temperature
  ids_C = j + n * jnp.arange(w_DxC.shape[1])
  return jnp.where(ids_C < vocab, logits, -jnp.inf)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def vocab_logps(h_BxTxD, w_DxV, targets_BxT, n: int, temperature: float = 1.0):
  """log softmax(h @ w / temperature)[target] float32 [B, T] by n slices of the vocabulary (see the module
  docstring): at most [B, T, V / n] logits at a time, forward and backward."""
  return _vocab_fwd(h_BxTxD, w_DxV, targets_BxT, n, temperature)[0]


def _vocab_fwd(h_BxTxD, w_DxV, targets_BxT, n, temperature):
  vocab = w_DxV.shape[1]
  b, t, _ = h_BxTxD.shape

  def body(carry, xs):
    m, s, at = carry  # running max, sum of exp(logit - max), the target's logit; each [B, T]
    w_DxC, j = xs
    logits = _slice_logits(h_BxTxD, w_DxC, j, n, vocab, temperature)
    m_new = jnp.maximum(m, jnp.max(logits, axis=-1))
    s = s * jnp.exp(m - m_new) + jnp.sum(jnp.exp(logits - m_new[..., None]), axis=-1)
    here = jnp.take_along_axis(logits, (targets_BxT // n)[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return (m_new, s, jnp.where(targets_BxT % n == j, here, at)), None

  init = (jnp.full((b, t), -jnp.inf, jnp.float32), jnp.zeros((b, t), jnp.float32), jnp.zeros((b, t), jnp.float32))
  (m, s, at), _ = jax.lax.scan(body, init, (_vocab_slices(w_DxV, n), jnp.arange(n)))
  lse = m + jnp.log(s)
  return at - lse, (h_BxTxD, w_DxV, targets_BxT, lse)


def _vocab_bwd(n, temperature, res, g_BxT):
  h_BxTxD, w_DxV, targets_BxT, lse_BxT = res
  d, vocab = w_DxV.shape

  def body(dh_BxTxD, xs):
    w_DxC, j = xs
    logits = _slice_logits(h_BxTxD, w_DxC, j, n, vocab, temperature)
    hit = (targets_BxT % n == j)[..., None] & ((targets_BxT // n)[..., None] == jnp.arange(w_DxC.shape[1]))
    dlogits = g_BxT[..., None] * (hit.astype(jnp.float32) - jnp.exp(logits - lse_BxT[..., None])) / temperature
    dlogits = dlogits.astype(h_BxTxD.dtype)
    w_DxC = constrain(w_DxC, ("act_embed", "vocab"))
    dh_BxTxD = dh_BxTxD + jnp.einsum("btc,dc->btd", dlogits, w_DxC, preferred_element_type=jnp.float32)
    dw_DxC = jnp.einsum("btd,btc->dc", h_BxTxD, dlogits, preferred_element_type=jnp.float32)
    return dh_BxTxD, constrain(dw_DxC.astype(w_DxV.dtype), ("embed", "vocab"))  # reduce-scattered per slice

  dh, dw_NxDxC = jax.lax.scan(body, jnp.zeros(h_BxTxD.shape, jnp.float32), (_vocab_slices(w_DxV, n), jnp.arange(n)))
  dw_DxV = dw_NxDxC.transpose(1, 2, 0).reshape(d, -1)[:, :vocab]
  return dh.astype(h_BxTxD.dtype), dw_DxV, None


vocab_logps.defvjp(_vocab_fwd, _vocab_bwd)


def vocab_slices(vocab: int) -> int:
  """How many slices `token_logps` splits a vocabulary in (1 for a small one)."""
  return max(1, -(-vocab // VOCAB_SLICE))


def token_logps(graphdef, weights, inputs_BxT, targets_BxT, logp: Callable | None = None, chunk: int = CHUNK,
                temperature: float = 1.0, **forward_kw):
  """Log-probs float32 [B, T] of targets_BxT under the model's logits on inputs_BxT, never holding [B, T, V] logits:
  log softmax(logits / temperature) by vocabulary slices, or with `logp` (a function of the whole logits and the
  targets, e.g. the sampler's filtered distribution) by `chunk` positions at a time."""
  from flax import nnx
  model = nnx.merge(graphdef, weights)
  h_BxTxD = model(inputs_BxT, return_hidden=True, **forward_kw).logits
  if logp is None:
    return vocab_logps(h_BxTxD, model.head_weight(), targets_BxT, vocab_slices(model.cfg.vocab_size),
                       float(temperature))
  return chunked_logps(h_BxTxD, model.head_weight(), targets_BxT, logp, chunk)


def next_token_loss(graphdef, params, tokens_BxT, mask_BxT=None):
  """Mean cross-entropy of predicting tokens[:, 1:] from tokens[:, :-1]; mask_BxT marks real tokens.

  Returns (loss, {"loss_sum", "tokens"}) so data-parallel callers can also sum exactly.
  """
  targets = tokens_BxT[:, 1:]
  ce = -token_logps(graphdef, params, tokens_BxT[:, :-1], targets)  # [B, T-1] float32
  valid = jnp.ones(targets.shape, bool) if mask_BxT is None else (mask_BxT[:, 1:] & mask_BxT[:, :-1])
  total = jnp.sum(jnp.where(valid, ce, 0.0))
  count = jnp.maximum(jnp.sum(valid), 1)
  return total / count, {"loss_sum": total, "tokens": count}


def loss_and_grad(graphdef):
  """`jax.value_and_grad` of `next_token_loss` w.r.t. params (has_aux)."""
  return jax.value_and_grad(lambda p, t, m=None: next_token_loss(graphdef, p, t, m), has_aux=True)
