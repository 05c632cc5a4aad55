"""Every parameter of the decoder, as data: path, shape, logical axes and initialiser. No JAX here.

The model's modules (`model.py`) create their parameters from this table and `jaxpod plan` counts bytes from it,
so the two cannot disagree. The decoder's blocks are one stacked module: each block parameter is stored once as
[L, ...] under `layers.` (logical axis `layers` first) and the forward scans over that axis (`stack.py`).

    block_tensors(cfg)   # one block's parameters, per layer: ("self_attn.q_proj", (D, H, E), axes, "normal"), ...
    tensors(cfg)         # the whole model's state: embed_tokens, layers.* [L, ...], norm, lm_head
"""
from __future__ import annotations

import dataclasses

from jaxpod.models.llama.config import LlamaConfig

INITS = ("normal", "zeros", "norm")  # normal(0.02) matrices; zero biases; identity norm weights (ones, or zeros for 1 + w)


@dataclasses.dataclass(frozen=True)
class Tensor:
  """One parameter: its path in the model's state (dots), shape, logical axes and initialiser."""

  name: str
  shape: tuple[int, ...]
  axes: tuple[str | None, ...]
  init: str = "normal"  # one of INITS

  @property
  def size(self) -> int:
    n = 1
    for d in self.shape:
      n *= d
    return n

  @property
  def leaf(self) -> str:
    """The attribute name on its module (`q_proj` of `self_attn.q_proj`)."""
    return self.name.rsplit(".", 1)[-1]


def attention_tensors(cfg: LlamaConfig) -> list[Tensor]:
  """One block's attention parameters (names relative to `self_attn`), in creation order."""
  d, h, k, e = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim_
  out = [Tensor("q_proj", (d, h, e), ("embed", "heads", "head_dim")),
         Tensor("k_proj", (d, k, e), ("embed", "kv_heads", "head_dim")),
         Tensor("v_proj", (d, k, e), ("embed", "kv_heads", "head_dim")),
         Tensor("o_proj", (h, e, d), ("heads", "head_dim", "embed"))]
  if cfg.qkv_bias:
    out += [Tensor("q_bias", (h, e), ("heads", "head_dim"), "zeros"),
            Tensor("k_bias", (k, e), ("kv_heads", "head_dim"), "zeros"),
            Tensor("v_bias", (k, e), ("kv_heads", "head_dim"), "zeros")]
  if cfg.qk_norm:
    out += [Tensor("q_norm", (e,), ("head_dim",), "norm"), Tensor("k_norm", (e,), ("head_dim",), "norm")]
  return out


def mlp_tensors(cfg: LlamaConfig) -> list[Tensor]:
  """One block's MLP parameters (names relative to `mlp`), in creation order."""
  d, i = cfg.hidden_size, cfg.intermediate_size
  return [Tensor("gate_proj", (d, i), ("embed", "mlp")), Tensor("up_proj", (d, i), ("embed", "mlp")),
          Tensor("down_proj", (i, d), ("mlp", "embed"))]


def block_norm_names(cfg: LlamaConfig) -> tuple[str, ...]:
  """A block's own norm weights [D]: the input and post-attention norms, and with sandwich norms two more."""
  extra = ("pre_feedforward_layernorm", "post_feedforward_layernorm") if cfg.sandwich_norms else ()
  return ("input_layernorm", "post_attention_layernorm") + extra


def block_tensors(cfg: LlamaConfig) -> list[Tensor]:
  """One decoder block's parameters, per layer (no L axis), names relative to the block."""
  d = cfg.hidden_size
  norms = [Tensor(n, (d,), ("act_embed",), "norm") for n in block_norm_names(cfg)]
  return (norms + [dataclasses.replace(t, name="self_attn." + t.name) for t in attention_tensors(cfg)]
          + [dataclasses.replace(t, name="mlp." + t.name) for t in mlp_tensors(cfg)])


def stacked(t: Tensor, layers: int) -> Tensor:
  """A block parameter as the model stores it: [L, ...] under `layers.`, logical axis `layers` first."""
  return Tensor("layers." + t.name, (layers, *t.shape), ("layers", *t.axes), t.init)


def tensors(cfg: LlamaConfig, stacked_layers: bool = True) -> list[Tensor]:
  """Every parameter of the model's state, sorted by path as NNX flattens it: block parameters stacked [L, ...]
  (what the model stores), or with `stacked_layers=False` one per layer, `layers.<i>.<name>` (a checkpoint's
  tensors: what a load or an export holds at a time)."""
  d, v = cfg.hidden_size, cfg.vocab_size
  out = [Tensor("embed_tokens", (v, d), ("vocab", "embed")), Tensor("norm", (d,), ("act_embed",), "norm")]
  if not cfg.tie_word_embeddings:
    out.append(Tensor("lm_head", (d, v), ("embed", "vocab")))
  if stacked_layers:
    return sorted(out + [stacked(t, cfg.num_hidden_layers) for t in block_tensors(cfg)], key=lambda t: t.name)
  layers = [dataclasses.replace(t, name=f"layers.{i}.{t.name}") for i in range(cfg.num_hidden_layers)
            for t in sorted(block_tensors(cfg), key=lambda t: t.name)]
  return sorted(out, key=lambda t: t.name)[:1] + layers + sorted(out, key=lambda t: t.name)[1:]


def kv_bytes_per_token(cfg: LlamaConfig, itemsize: int) -> int:
  """K and V of every layer for one token at `itemsize` bytes per element (what every KV layout stores)."""
  return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim_ * itemsize
