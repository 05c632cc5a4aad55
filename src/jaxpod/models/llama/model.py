"""Llama-family decoder in Flax NNX: GQA, split-half RoPE (with Llama-3 scaling), RMSNorm, gated MLP.

The same blocks serve every family in `families/`; the config's switches add q/k/v biases
(Qwen2), per-head q/k norms (Qwen3, Gemma 3), (1 + w) norms, scaled embeddings, GELU and
sandwich norms (Gemma 3), and sliding-window layers (Mistral, Gemma 3, Qwen2/3 when enabled).

Every parameter is declared once, with its logical axes (`runtime/sharding.py` names), so
abstract shapes, shardings and HF loading all derive from the module tree. Shapes in names
use B=batch, T=new tokens, S=key slots, D=hidden, H=query heads, K=kv heads, G=H/K,
E=head_dim, I=mlp width, V=vocab, L=layers.

One attention rule serves training, prefill and decode. Tokens occupy *slots*; a query in
slot q sees key slot s iff `s <= q and kv_mask[b, s]`. Without a cache the slots are
`0..T-1`. With a static cache [L, B, K, S, E] the T new tokens are written at slots
`cache_index .. cache_index+T-1` (one scalar index for the whole batch), and `kv_mask`
says which slots of each row hold real keys. RoPE uses `positions`, which need not equal
slots: the sampler puts ragged prompts right-padded at slots 0.. and every decode step at
one shared slot, with true per-row positions. A sliding layer (window W) also requires
`q_pos - k_pos < W`, on positions: the static cache keeps each slot's position (`KVCache.pos`).

With a `PagedKVCache` or a `SlotKVCache` (see `kv.py`) a token's slot is its position. A
call's T new tokens (at positions p0..p0+T-1 of each row) attend to the cached slots below
p0 (none when kv_len=0, as in a prefill from position 0), plus causally to each other; the
softmax runs over both parts at once without concatenating the cached keys (a copy), and
the new keys/values come back staged in the returned cache for the caller to write when no
later read of the buffers remains in its program. Sliding layers keep every key and mask
those older than the window (same tokens; no memory saved).

Captures (for activation extraction): `capture_layers=(i, ...)` and
`capture_points=("resid", "attn_out", "mlp_out")` return `out.captures["resid.3"]` etc.,
each [B, T, D] in the compute dtype:
  resid.i    residual stream after block i (HF `hidden_states[i+1]`, except that HF applies
             the final norm to its last entry and jaxpod does not)
  attn_out.i output of block i's attention (after o_proj; Gemma 3: after its post-attention norm), as added
             to the residual
  mlp_out.i  output of block i's MLP (after down_proj; Gemma 3: after its post-feedforward norm), as added
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from jaxpod.models.llama import kernels, params as table, stack
from jaxpod.models.llama.attention import context, self_attention, soft_capped, visible
from jaxpod.models.llama.config import LlamaConfig
from jaxpod.models.llama.kv import CACHE_AXES, PAGE_AXES, SLOT_AXES, KVCache, PagedKVCache, SlotKVCache  # noqa: F401
from jaxpod.runtime.sharding import DEFAULT as DEFAULT_RULES, constrain

CAPTURE_POINTS = ("resid", "attn_out", "mlp_out")
_ACT = ("batch", "seq", "act_embed")


class Output(NamedTuple):
  """What `Llama.__call__` returns: logits [B, T, V] float32 (or hidden [B, T, D]), cache, captures."""

  logits: jax.Array
  cache: KVCache | None
  captures: dict[str, jax.Array]


def make_param(cfg: LlamaConfig, t: table.Tensor, rngs: nnx.Rngs) -> nnx.Param:
  """The parameter `t` of the table (`params.py`) in the storage dtype: normal(0.02) matrices (a draw from `rngs`),
  zero biases, identity norms (ones, or zeros for (1 + w) norms)."""
  dt = cfg.jnp_param_dtype
  if t.init == "normal":
    value = (0.02 * jax.random.normal(rngs.params(), t.shape, jnp.float32)).astype(dt)
  else:
    value = (jnp.zeros if t.init == "zeros" or cfg.norm_plus_one else jnp.ones)(t.shape, dt)
  return nnx.Param(value, logical_axes=t.axes)


def read(var, dtype):
  """A parameter's value in the compute dtype (float32 master weights are cast where they are used)."""
  w = var[...]
  return w if w.dtype == dtype else w.astype(dtype)


def rms_norm(x, w, eps: float, plus_one: bool = False):
  """HF RMSNorm: w * (x32 * rsqrt(mean(x32^2) + eps)).astype(dtype); Gemma's: (y32 * (1 + w32)).astype(dtype)."""
  x32 = x.astype(jnp.float32)
  y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  if plus_one:
    return (y * (1.0 + w.astype(jnp.float32))).astype(x.dtype)
  return w.astype(x.dtype) * y.astype(x.dtype)


_BY_DATA = DEFAULT_RULES.replace(batch="data")  # rows over `data` only: every fsdp shard looks up every token


def embed(cfg: LlamaConfig, table_VxD, tokens_BxT):
  """Token embeddings [B, T, D] (times sqrt(D) in the compute dtype for Gemma); the table is never gathered.

  Each device looks up its rows' tokens in its own slice of the table: the vocab split over `model` (each shard's
  rows looked up locally and summed over `model`), the hidden dim over `fsdp` (each fsdp shard looks up the
  tokens of every fsdp shard's rows, [B/data, T, D/fsdp], then an all-to-all puts the rows back over fsdp). The
  gradient is scattered into the slice the same way. Gathering the table over fsdp instead held the whole
  [V, D] table and its [V, D] gradient on every device (Llama-3-8B: 1 GiB each in bf16, on v5p's compiler); a
  lookup whose output kept the rows over fsdp made XLA rematerialise the table whole on fsdp x model meshes. In
  the engine's inference layout the table is whole over fsdp already, so nothing moves."""
  tokens_BxT = constrain(tokens_BxT, ("batch", "seq"), _BY_DATA)
  x = constrain(jnp.take(table_VxD, tokens_BxT, axis=0), ("batch", "seq", "embed"), _BY_DATA)
  x = constrain(x.astype(cfg.jnp_dtype), _ACT)
  return x * jnp.asarray(math.sqrt(cfg.hidden_size), x.dtype) if cfg.scale_embeddings else x


def rope_tables(positions_BxT, inv_freq_E2):
  """(cos, sin) [B, T, 1, E] float32 of the split-half rotary embedding, computed once per forward for every layer.

  cos and sin are taken of the [B, T, E/2] angles and then repeated: taken after the repeat, XLA:CPU fused them into
  each q/k consumer (every layer, forward and backward) and evaluated them per element of [B, T, heads, E]
  (the GRPO step at 256 x 40: 10 such fusions, the step 4-10% slower)."""
  freqs = positions_BxT.astype(jnp.float32)[..., None] * inv_freq_E2  # [B, T, E/2]
  cos, sin = jnp.cos(freqs), jnp.sin(freqs)
  return tuple(jnp.concatenate([c, c], axis=-1)[:, :, None, :] for c in (cos, sin))


def rope(x_BxTxNxE, cos_sin):
  """Split-half rotary embedding (HF `rotate_half` form) with `rope_tables`' (cos, sin), cast to x's dtype."""
  cos, sin = (c.astype(x_BxTxNxE.dtype) for c in cos_sin)
  half = x_BxTxNxE.shape[-1] // 2
  rot = jnp.concatenate([-x_BxTxNxE[..., half:], x_BxTxNxE[..., :half]], axis=-1)
  return x_BxTxNxE * cos + rot * sin


def dense(x_BxTxF, w_FxO, **kw):
  """x @ w over x's last axis as one 2-D matmul on the flattened rows [B*T, F] (w's trailing axes flattened too,
  [F, ...] -> [B, T, ...]). Why: for a 3-D x, XLA:CPU builds the weight gradient by first copying the output's
  gradient transposed; on [B*T, F] it contracts both operands' row axis in place (an MLP's forward + backward at the
  GRPO step's shapes: 87 vs 149 ms)."""
  b, t, f = x_BxTxF.shape
  return jnp.matmul(x_BxTxF.reshape(b * t, f), w_FxO.reshape(f, -1), **kw).reshape(b, t, *w_FxO.shape[1:])


def adapted(module: nnx.Module, name: str, x_BxTxF, y):
  """y = x @ module.<name> plus its LoRA adapter's s * x A B when `lora.py` attached one (`<name>_lora`)."""
  adapter = getattr(module, f"{name}_lora", None)
  return y if adapter is None else y + adapter(x_BxTxF).reshape(y.shape).astype(y.dtype)


class Attention(nnx.Module):
  """Grouped-query attention; query head j uses kv head j // G."""

  def __init__(self, cfg: LlamaConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    for t in table.attention_tensors(cfg):  # q, k, v, o projections; biases (Qwen2); q/k norms (Qwen3, Gemma 3)
      setattr(self, t.leaf, make_param(cfg, t, rngs))

  def _project(self, x_BxTxD, name: str, axes):
    """x @ {q,k,v}_proj (+ bias): [B, T, heads, E]."""
    dt = self.cfg.jnp_dtype
    y = adapted(self, f"{name}_proj", x_BxTxD, dense(x_BxTxD, read(getattr(self, f"{name}_proj"), dt)))
    if self.cfg.qkv_bias:
      y = y + read(getattr(self, f"{name}_bias"), dt)
    return constrain(y, ("batch", "seq", axes, "head_dim"))

  def __call__(self, x_BxTxD, positions_BxT, kv_mask_BxS, cache, cache_index, layer: int, rope_cs, kv_len=None,
               window=None):
    """rope_cs: `rope_tables` for this layer's kind; window: keys a query sees back from itself (None: all); the
    caller passes its layer's."""
    cfg = self.cfg
    e = cfg.head_dim_
    b, t, _ = x_BxTxD.shape
    q, k, v = (self._project(x_BxTxD, "q", "heads"), self._project(x_BxTxD, "k", "kv_heads"),
               self._project(x_BxTxD, "v", "kv_heads"))
    if cfg.qk_norm:
      q = rms_norm(q, self.q_norm[...], cfg.rms_norm_eps, cfg.norm_plus_one)
      k = rms_norm(k, self.k_norm[...], cfg.rms_norm_eps, cfg.norm_plus_one)
    q, k = rope(q, rope_cs), rope(k, rope_cs)
    k_BxKxTxE, v_BxKxTxE = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
    if isinstance(cache, (PagedKVCache, SlotKVCache)):
      cache = cache.stage(k, v)
      with jax.named_scope("attention"):
        ctx = _attend_cached(cfg, q, k_BxKxTxE, v_BxKxTxE, cache, layer, positions_BxT, kv_len, window)
    else:
      ctx, cache = self._attend_static(q, k_BxKxTxE, v_BxKxTxE, kv_mask_BxS, cache, cache_index, layer, kv_len,
                                       positions_BxT, window)
    # one flat contraction over H*E: with two contracting dims XLA CPU transposed all of o_proj every step
    o_FxD = read(self.o_proj, cfg.jnp_dtype).reshape(cfg.num_attention_heads * e, -1)
    ctx_BxTxF = ctx.reshape(b, t, -1)
    return constrain(adapted(self, "o_proj", ctx_BxTxF, dense(ctx_BxTxF, o_FxD)), _ACT), cache

  def _attend_static(self, q_BxTxHxE, k_BxKxTxE, v_BxKxTxE, kv_mask_BxS, cache, cache_index, layer, kv_len,
                     positions_BxT, window):
    """(context [B, T, H, E], cache) without a cache or with the static one (written in place at cache_index;
    its slot positions `cache.pos` are written once per call by `Llama.__call__`)."""
    cfg = self.cfg
    b, t, h, e = q_BxTxHxE.shape
    kvh = cfg.num_key_value_heads
    if cache is None:  # training, scoring: causal over the call's own keys, by the platform's kernel
      with jax.named_scope("attention"):
        ctx = self_attention(cfg, q_BxTxHxE, k_BxKxTxE, v_BxKxTxE, kv_mask_BxS, positions_BxT, window)
      return constrain(ctx, ("batch", "seq", "heads", "head_dim")), None
    start = (layer, 0, 0, cache_index, 0)
    cache = cache._replace(k=jax.lax.dynamic_update_slice(cache.k, k_BxKxTxE[None].astype(cache.k.dtype), start),
                           v=jax.lax.dynamic_update_slice(cache.v, v_BxKxTxE[None].astype(cache.v.dtype), start))
    keys_BxKxSxE, values_BxKxSxE = cache.k[layer, :, :, :kv_len], cache.v[layer, :, :, :kv_len]
    kv_mask_BxS = kv_mask_BxS[:, :kv_len]
    q_slots_BxT = jnp.broadcast_to(cache_index + jnp.arange(t), (b, t))
    k_pos_BxS = cache.pos[:, :kv_len]
    s = keys_BxKxSxE.shape[2]
    mask_BxTxS = ((jnp.arange(s)[None, None, :] <= q_slots_BxT[:, :, None]) & kv_mask_BxS[:, None, :]
                  & visible(positions_BxT[:, :, None], k_pos_BxS[:, None, :], window))
    with jax.named_scope("attention"):
      q_BxTxKxGxE = q_BxTxHxE.reshape(b, t, kvh, h // kvh, e)
      ctx = context(q_BxTxKxGxE, keys_BxKxSxE, values_BxKxSxE, mask_BxTxS, cfg.attn_scale, cfg.attn_logit_softcapping)
    return constrain(ctx.reshape(b, t, h, e), ("batch", "seq", "heads", "head_dim")), cache


def _attend_cached(cfg: LlamaConfig, q_BxTxHxE, k_BxKxTxE, v_BxKxTxE, cache, layer: int, positions_BxT, kv_len,
                   window):
  """Context [B, T, H, E] of T new tokens over the cached slots below each row's first position (read in place
  from a slot cache, gathered from pages; none if kv_len == 0) and causally over the new tokens themselves. A prefill
  (kv_len == 0) runs on `cfg.attention`'s kernel (`kernels.py`: splash on TPU, cuDNN on GPU)."""
  b, t, h, e = q_BxTxHxE.shape
  if kv_len == 0 and (impl := kernels.choose(cfg, q_BxTxHxE.shape, q_BxTxHxE.dtype)) != "xla":  # a prefill
    ctx = kernels.attend(impl, cfg, q_BxTxHxE, k_BxKxTxE, v_BxKxTxE, jnp.ones((b, t), bool), window)
    return constrain(ctx, ("batch", "seq", "heads", "head_dim"))
  kvh = cfg.num_key_value_heads
  q_BxTxKxGxE = q_BxTxHxE.reshape(b, t, kvh, h // kvh, e)
  scale, lowest = cfg.attn_scale, jnp.finfo(jnp.float32).min
  cap = cfg.attn_logit_softcapping
  new = soft_capped(jnp.einsum("btkge,bkse->bkgts", q_BxTxKxGxE, k_BxKxTxE, preferred_element_type=jnp.float32)
                    * scale, cap)
  steps_TxT = jnp.arange(t)[:, None] - jnp.arange(t)[None, :]  # query index - key index (= position difference)
  new = jnp.where(((steps_TxT >= 0) & visible(steps_TxT, 0, window))[None, None, None], new, lowest)
  if kv_len == 0:
    probs = jax.nn.softmax(new, axis=-1).astype(v_BxKxTxE.dtype)
    ctx = jnp.einsum("bkgts,bkse->btkge", probs, v_BxKxTxE)
  else:
    if isinstance(cache, PagedKVCache):
      kv_len = cache.table_BxM.shape[1] * cache.k.shape[3] if kv_len is None else kv_len
    old_k_BxKxSxE, old_v_BxKxSxE = cache.read(layer, kv_len)
    s = old_k_BxKxSxE.shape[2]
    old = soft_capped(jnp.einsum("btkge,bkse->bkgts", q_BxTxKxGxE, old_k_BxKxSxE, preferred_element_type=jnp.float32)
                      * scale, cap)
    slot_S = jnp.arange(s)
    seen_BxTxS = ((slot_S[None, None, :] < positions_BxT[:, :1, None])  # slots below the row's first new position
                  & visible(positions_BxT[:, :, None], slot_S[None, None, :], window))  # a slot's position is itself
    old = jnp.where(seen_BxTxS[:, None, None], old, lowest)
    probs = jax.nn.softmax(jnp.concatenate([old, new], axis=-1), axis=-1)  # scores only: [B, K, G, T, S + T]
    p_old, p_new = probs[..., :s].astype(old_v_BxKxSxE.dtype), probs[..., s:].astype(v_BxKxTxE.dtype)
    ctx = (jnp.einsum("bkgts,bkse->btkge", p_old, old_v_BxKxSxE)
           + jnp.einsum("bkgts,bkse->btkge", p_new, v_BxKxTxE.astype(old_v_BxKxSxE.dtype)))
  return constrain(ctx.reshape(b, t, h, e), ("batch", "seq", "heads", "head_dim"))


class MLP(nnx.Module):
  """Gated MLP: down(act(gate(x)) * up(x)); act silu (SwiGLU) or tanh-approximated GELU (Gemma)."""

  def __init__(self, cfg: LlamaConfig, *, rngs: nnx.Rngs):
    self.dtype = cfg.jnp_dtype
    self.act = jax.nn.silu if cfg.hidden_act == "silu" else functools.partial(jax.nn.gelu, approximate=True)
    for t in table.mlp_tensors(cfg):  # gate, up, down
      setattr(self, t.leaf, make_param(cfg, t, rngs))

  def __call__(self, x_BxTxD):
    gate, up = (adapted(self, n, x_BxTxD, dense(x_BxTxD, read(getattr(self, n), self.dtype)))
                for n in ("gate_proj", "up_proj"))
    h = constrain(self.act(gate) * up, ("batch", "seq", "mlp"))
    return constrain(adapted(self, "down_proj", h, dense(h, read(self.down_proj, self.dtype))), _ACT)


class Block(nnx.Module):
  """Pre-norm decoder block: x + attn(norm(x)), then + mlp(norm(x)).

  Sandwich norms (Gemma 3): x + post_attention_norm(attn(input_norm(x))), then
  + post_feedforward_norm(mlp(pre_feedforward_norm(x))); HF's names, so post_attention_layernorm
  is the MLP's input norm in Llama and the attention's output norm in Gemma 3."""

  def __init__(self, cfg: LlamaConfig, *, rngs: nnx.Rngs):
    self.eps, self.plus_one, self.sandwich = cfg.rms_norm_eps, cfg.norm_plus_one, cfg.sandwich_norms
    for t in table.block_tensors(cfg):
      if "." not in t.name:  # the block's own norms; the attention's and MLP's parameters are theirs
        setattr(self, t.name, make_param(cfg, t, rngs))
    self.self_attn = Attention(cfg, rngs=rngs)
    self.mlp = MLP(cfg, rngs=rngs)

  def _norm(self, x, name: str):
    return rms_norm(x, getattr(self, name)[...], self.eps, self.plus_one)

  def __call__(self, x, positions, kv_mask, cache, cache_index, layer, rope_cs, kv_len=None, window=None):
    attn_out, cache = self.self_attn(self._norm(x, "input_layernorm"), positions, kv_mask,
                                     cache, cache_index, layer, rope_cs, kv_len, window)
    if self.sandwich:
      attn_out = self._norm(attn_out, "post_attention_layernorm")
    x = x + attn_out
    mlp_out = self.mlp(self._norm(x, "pre_feedforward_layernorm" if self.sandwich else "post_attention_layernorm"))
    if self.sandwich:
      mlp_out = self._norm(mlp_out, "post_feedforward_layernorm")
    return constrain(x + mlp_out, _ACT), cache, attn_out, mlp_out


class Llama(nnx.Module):
  """The decoder: embed -> L blocks -> final RMSNorm -> LM head (tied or not)."""

  def __init__(self, cfg: LlamaConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    top = {t.name: t for t in table.tensors(cfg) if not t.name.startswith("layers.")}
    self.embed_tokens = make_param(cfg, top["embed_tokens"], rngs)
    # built one by one (the random draws of a loop over blocks), stored stacked [L, ...] and run by a scan
    self.layers = stack.stack_modules([Block(cfg, rngs=rngs) for _ in range(cfg.num_hidden_layers)])
    self.norm = make_param(cfg, top["norm"], rngs)
    if not cfg.tie_word_embeddings:
      self.lm_head = make_param(cfg, top["lm_head"], rngs)

  def head_weight(self):
    """The LM head's matrix [D, V] in the compute dtype (the embedding's transpose when tied)."""
    return read(self.embed_tokens, self.cfg.jnp_dtype).T if self.cfg.tie_word_embeddings else \
        read(self.lm_head, self.cfg.jnp_dtype)

  def head(self, h_BxTxD):
    """Final-normed hidden -> float32 logits [B, T, V]."""
    return head_logits(h_BxTxD, self.head_weight())

  def __call__(self, tokens_BxT, positions_BxT=None, *, kv_mask_BxS=None,
               cache: KVCache | PagedKVCache | SlotKVCache | None = None,
               cache_index=0, capture_layers: Sequence[int] = (), capture_points: Sequence[str] = (),
               logits_at_B=None, return_hidden: bool = False, kv_len: int | None = None,
               stop_at: int | None = None) -> Output:
    """Run the decoder (see module docstring for slots, masks and captures).

    logits_at_B: if given, logits only at token index `logits_at_B[b]` of each row ([B, 1, V]).
    return_hidden: return final-normed hidden states instead of logits.
    kv_len: with a cache, attend only to its first kv_len slots (static; e.g. prefill of P prompt slots;
      paged: a multiple of the page size, default the whole table; paged or slots: 0 = read no cached slot).
    stop_at: run blocks 0..stop_at only, for their captures (logits None); stacked layers only.
    A cache needs the engine's form (`stack.unstacked`: a block per layer); the stacked layers run by a scan.
    """
    cfg = self.cfg
    b, t = tokens_BxT.shape
    _check_captures(cfg, capture_layers, capture_points)
    if positions_BxT is None:
      positions_BxT = jnp.broadcast_to(cache_index + jnp.arange(t), (b, t))
    if kv_mask_BxS is None and not isinstance(cache, (PagedKVCache, SlotKVCache)):
      kv_mask_BxS = jnp.ones((b, t if cache is None else cache.k.shape[3]), bool)
    if isinstance(cache, KVCache):  # the slots' positions, for sliding layers
      cache = cache._replace(pos=jax.lax.dynamic_update_slice(cache.pos, positions_BxT.astype(cache.pos.dtype),
                                                              (0, cache_index)))
    kinds = {cfg.window(i) is not None for i in range(cfg.num_hidden_layers)}  # sliding layers may rotate differently
    tables = {local: rope_tables(positions_BxT, jnp.asarray(cfg.inv_freq(local), jnp.float32)) for local in kinds}
    x = embed(cfg, self.embed_tokens[...], tokens_BxT)
    if stack.is_stacked(self.layers):
      if cache is not None:
        raise ValueError("Llama: the stacked layers run without a KV cache; decode with the engine's form "
                         "(jaxpod.models.llama.stack.unstacked(model): a block per layer)")
      x, captures = stack.run(self.layers, cfg, x, positions_BxT, kv_mask_BxS, tables, capture_layers,
                              capture_points, stop_at)
      if stop_at is not None:
        return Output(None, None, captures)
      return self._finish(x, logits_at_B, return_hidden, None, captures)
    if stop_at is not None:
      raise ValueError("Llama: stop_at needs the stacked layers")
    captures = {}
    for i, block in enumerate(self.layers):
      with jax.named_scope(f"layer_{i}"):
        x, cache, attn_out, mlp_out = block(x, positions_BxT, kv_mask_BxS, cache, cache_index, i,
                                              tables[cfg.window(i) is not None], kv_len, cfg.window(i))
      if i in capture_layers:
        got = {"resid": x, "attn_out": attn_out, "mlp_out": mlp_out}
        captures.update({f"{p}.{i}": got[p] for p in capture_points})
    return self._finish(x, logits_at_B, return_hidden, cache, captures)

  def _finish(self, x, logits_at_B, return_hidden: bool, cache, captures) -> Output:
    """The final norm, then logits (at `logits_at_B` only, if given) or the hidden states."""
    cfg = self.cfg
    h = rms_norm(x, self.norm[...], cfg.rms_norm_eps, cfg.norm_plus_one)
    if logits_at_B is not None:
      h = jnp.take_along_axis(h, logits_at_B[:, None, None].astype(jnp.int32), axis=1)  # [B, 1, D]
    return Output(h if return_hidden else self.head(h), cache, captures)


def head_logits(h_BxTxD, w_DxV):
  """Final-normed hidden [B, T, D] x head [D, V] -> float32 logits [B, T, V] (`Llama.head`, or a chunk of positions)."""
  return constrain(dense(h_BxTxD, w_DxV, preferred_element_type=jnp.float32), ("batch", "seq", "vocab"))


def _check_captures(cfg: LlamaConfig, layers: Sequence[int], points: Sequence[str]) -> None:
  bad = [p for p in points if p not in CAPTURE_POINTS]
  if bad:
    raise ValueError(f"capture_points {bad} unknown; use some of {CAPTURE_POINTS}")
  out = [i for i in layers if not 0 <= i < cfg.num_hidden_layers]
  if out:
    raise ValueError(f"capture_layers {out} out of range; this model has layers 0..{cfg.num_hidden_layers - 1}")


def weight_decay_mask(params):
  """True for the parameters AdamW's weight decay applies to: the matrices, not norm weights nor biases (a stacked
  block weight [L, ...] counts its dimensions without L)."""
  def decays(path, x) -> bool:
    keys = [getattr(k, "key", getattr(k, "idx", None)) for k in path]
    per_layer = x.ndim - (1 if keys[:1] == ["layers"] and not isinstance(keys[1], int) else 0)
    return per_layer > 1 and "bias" not in jax.tree_util.keystr(path)
  return jax.tree_util.tree_map_with_path(decays, params)


def init(cfg: LlamaConfig, seed: int = 0, shardings=None) -> Llama:
  """A random model: normal(0.02) matrices and biases, identity norms, drawn with numpy (no compile) per parameter.

  The draws go in the order of a model with a block per layer (its flat state: embed_tokens, layer 0's parameters,
  layer 1's, ..., lm_head, norm), so a seed gives the weights it gave before the layers were stacked.
  shardings: optional `runtime.state_shardings(...)` tree; parameters are then placed sharded.
  `Llama(cfg, rngs=nnx.Rngs(seed))` gives the same distribution inside a jit.
  """
  import numpy as np
  graphdef, abs_state = nnx.split(abstract(cfg))
  rng = np.random.default_rng(seed)
  flat = nnx.to_flat_state(abs_state)

  def draw(shape):
    if len(shape) == 1:  # norms: identity
      return np.zeros(shape, np.float32) if cfg.norm_plus_one else np.ones(shape, np.float32)
    return 0.02 * rng.standard_normal(shape, np.float32)
  values = {}
  stacked = [p for p, _ in flat if p[0] == "layers"]
  for p, var in flat:
    if p[0] == "layers":
      if p == stacked[0]:  # every stacked leaf, layer by layer
        bufs = {q: np.zeros(tuple(v.shape), np.float32) for q, v in flat if q[0] == "layers"}
        for i in range(cfg.num_hidden_layers):
          for q in stacked:
            bufs[q][i] = draw(bufs[q].shape[1:])
        values.update(bufs)
      continue
    values[p] = draw(tuple(var.shape))
  shard_leaves = jax.tree.leaves(shardings) if shardings is not None else [None] * len(flat)
  leaves = []
  for (p, var), sh in zip(flat, shard_leaves):
    w = values[p].astype(var.dtype)
    leaves.append(jnp.asarray(w) if sh is None else jax.make_array_from_callback(w.shape, sh, lambda i, w=w: w[i]))
  return nnx.merge(graphdef, nnx.from_flat_state([(p, v.replace(a)) for (p, v), a in zip(flat, leaves)]))


def abstract(cfg: LlamaConfig) -> Llama:
  """The model with ShapeDtypeStruct leaves: shapes, dtypes and logical axes, no memory."""
  return nnx.eval_shape(lambda: Llama(cfg, rngs=nnx.Rngs(params=0)))


def forward(graphdef, params, tokens_BxT, positions_BxT=None, **kwargs) -> Output:
  """Pure forward: `nnx.merge(graphdef, params)(tokens, ...)`; jit this, not the module."""
  return nnx.merge(graphdef, params)(tokens_BxT, positions_BxT, **kwargs)
