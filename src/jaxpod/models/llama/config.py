"""`LlamaConfig`: the shape of a Llama-family decoder, read from a Hugging Face `config.json`.

One decoder serves every family (`families/`): a family is a set of switches on this config
(q/k/v biases, q/k norms, (1 + w) norms, sliding layers, ...), and its module maps config.json
onto them and back; `model_type` picks the module. Both config generations are read: newer
files carry `rope_parameters` (with `rope_theta`, `rope_type` and scaling fields) and
`head_dim`; older ones carry top-level `rope_theta` and an optional `rope_scaling` dict.
RoPE types supported: `default`, `linear` and `llama3`.
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Mapping

import numpy as np

from jaxpod.models.llama import families

ROPE_TYPES = ("default", "linear", "llama3")
DTYPES = ("float32", "bfloat16")
REMATS = ("none", "full", "dots", "offload")
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")
LAYER_KINDS = ("full_attention", "sliding_attention")
ATTENTIONS = ("auto", "xla", "splash", "cudnn")


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
  """Sizes and numerics of a Llama-family decoder (one field per HF config key it mirrors)."""

  vocab_size: int = 32000  # rows of the embedding and of the LM head
  hidden_size: int = 512  # residual-stream width D
  intermediate_size: int = 1376  # SwiGLU hidden width I
  num_hidden_layers: int = 8  # decoder blocks L
  num_attention_heads: int = 8  # query heads H
  num_key_value_heads: int = 8  # key/value heads KV (GQA when KV < H); H % KV == 0
  head_dim: int | None = None  # per-head width hd; None means hidden_size // num_attention_heads
  rms_norm_eps: float = 1e-6  # RMSNorm epsilon (released Llama-2/3 use 1e-5)
  rope_theta: float = 10000.0  # RoPE base
  rope_type: str = "default"  # default | linear | llama3
  rope_factor: float = 1.0  # linear / llama3 scaling factor
  rope_low_freq_factor: float = 1.0  # llama3 only
  rope_high_freq_factor: float = 4.0  # llama3 only
  rope_original_max_position: int = 8192  # llama3 only: original_max_position_embeddings
  max_position_embeddings: int = 2048  # longest sequence the checkpoint was trained for
  tie_word_embeddings: bool = False  # LM head reuses the embedding matrix (no lm_head.weight)
  bos_token_id: int | None = 1
  eos_token_id: tuple[int, ...] = (2,)  # HF allows one id or a list; always a tuple here
  pad_token_id: int | None = None
  dtype: str = "float32"  # compute dtype (and the parameters' unless param_dtype is set): float32 | bfloat16
  model_type: str = "llama"  # family (config.json model_type): how config.json is read and written
  qkv_bias: bool = False  # q/k/v projections carry a bias (Qwen2)
  qk_norm: bool = False  # RMSNorm over head_dim on every query and key head before RoPE (Qwen3, Gemma 3)
  norm_plus_one: bool = False  # RMSNorm scales by (1 + w) in float32, weights stored around 0 (Gemma)
  scale_embeddings: bool = False  # embeddings times sqrt(hidden_size), rounded to the compute dtype (Gemma)
  hidden_act: str = "silu"  # MLP gate activation: silu | gelu_pytorch_tanh (Gemma)
  sandwich_norms: bool = False  # also norm the attention and MLP outputs; MLP input norm is pre_feedforward (Gemma 3)
  query_pre_attn_scalar: float | None = None  # attention scale query_pre_attn_scalar**-0.5 (Gemma); None: head_dim
  sliding_window: int | None = None  # a sliding layer's query at i sees keys j with i - window < j <= i
  layer_types: tuple[str, ...] = ()  # per layer: full_attention | sliding_attention; () = all full
  rope_local_theta: float | None = None  # RoPE base of sliding layers (Gemma 3 local layers); None: rope_theta
  attn_logit_softcapping: float | None = None  # scores -> cap * tanh(scores / cap) before the softmax (Gemma 2)
  # How jaxpod computes (not in config.json):
  param_dtype: str | None = None  # storage dtype of the weights (float32: master weights for bf16 compute); None: dtype
  remat: str = "none"  # activations kept for the backward pass: none | full | dots | offload (models/llama/stack.py)
  # attention without a KV cache (training, prefill; models/llama/kernels.py): auto (splash on TPU, cuDNN on GPU
  # where it serves the model, XLA otherwise) | xla | splash (Pallas; interpreted on CPU) | cudnn
  attention: str = "auto"

  def __post_init__(self):
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                 "num_attention_heads", "num_key_value_heads"):
      if getattr(self, name) < 1:
        raise ValueError(f"LlamaConfig.{name} must be >= 1, got {getattr(self, name)}")
    if self.num_attention_heads % self.num_key_value_heads:
      raise ValueError(
          f"LlamaConfig.num_attention_heads={self.num_attention_heads} is not a multiple of "
          f"num_key_value_heads={self.num_key_value_heads}; GQA needs H % KV == 0")
    if self.head_dim is None and self.hidden_size % self.num_attention_heads:
      raise ValueError(f"LlamaConfig.hidden_size={self.hidden_size} is not divisible by num_attention_heads="
                       f"{self.num_attention_heads}; set head_dim explicitly")
    if self.head_dim_ % 2:
      raise ValueError(f"LlamaConfig.head_dim={self.head_dim_} must be even for RoPE")
    if self.rope_type not in ROPE_TYPES:
      raise ValueError(f"LlamaConfig.rope_type={self.rope_type!r} is not supported; use one of {ROPE_TYPES}")
    if self.dtype not in DTYPES:
      raise ValueError(f"LlamaConfig.dtype={self.dtype!r}; use one of {DTYPES}")
    if self.param_dtype is not None and self.param_dtype not in DTYPES:
      raise ValueError(f"LlamaConfig.param_dtype={self.param_dtype!r}; use one of {DTYPES} (or leave it unset: dtype)")
    if self.remat not in REMATS:
      raise ValueError(f"LlamaConfig.remat={self.remat!r}; use one of {REMATS}")
    if self.attention not in ATTENTIONS:
      raise ValueError(f"LlamaConfig.attention={self.attention!r}; use one of {ATTENTIONS}")
    if self.attn_logit_softcapping is not None and not self.attn_logit_softcapping > 0:
      raise ValueError(f"LlamaConfig.attn_logit_softcapping={self.attn_logit_softcapping}; expected > 0 (or None)")
    if not isinstance(self.eos_token_id, tuple):
      raise ValueError(f"LlamaConfig.eos_token_id must be a tuple of ints, got {self.eos_token_id!r}")
    families.family(self.model_type)
    if self.hidden_act not in ACTIVATIONS:
      raise ValueError(f"LlamaConfig.hidden_act={self.hidden_act!r}; use one of {ACTIVATIONS}")
    if self.layer_types and len(self.layer_types) != self.num_hidden_layers:
      raise ValueError(f"LlamaConfig.layer_types has {len(self.layer_types)} entries for num_hidden_layers="
                       f"{self.num_hidden_layers}; give one per layer (or none: all full attention)")
    bad = sorted(set(self.layer_types) - set(LAYER_KINDS))
    if bad:
      raise ValueError(f"LlamaConfig.layer_types has {bad}; use {LAYER_KINDS}")
    if "sliding_attention" in self.layer_types and not (self.sliding_window or 0) >= 1:
      raise ValueError(f"LlamaConfig.layer_types has sliding layers but sliding_window={self.sliding_window}; "
                       "set sliding_window >= 1")

  @property
  def layer_kinds(self) -> tuple[str, ...]:
    """Attention kind of every layer (full_attention when layer_types is empty)."""
    return self.layer_types or ("full_attention",) * self.num_hidden_layers

  def window(self, layer: int) -> int | None:
    """Keys a query of `layer` sees back from itself (None: all, causally)."""
    return self.sliding_window if self.layer_kinds[layer] == "sliding_attention" else None

  @property
  def attn_scale(self) -> float:
    """Multiplier of q.k scores."""
    return (self.query_pre_attn_scalar if self.query_pre_attn_scalar is not None else self.head_dim_) ** -0.5

  @property
  def head_dim_(self) -> int:
    """The per-head width actually used."""
    return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_attention_heads

  @property
  def jnp_dtype(self):
    """The compute dtype."""
    import jax.numpy as jnp
    return jnp.dtype(self.dtype)

  @property
  def param_dtype_(self) -> str:
    """The weights' storage dtype actually used."""
    return self.param_dtype or self.dtype

  @property
  def jnp_param_dtype(self):
    import jax.numpy as jnp
    return jnp.dtype(self.param_dtype_)

  def num_params(self) -> int:
    """Parameter count (embedding counted once when tied)."""
    d, i, hd = self.hidden_size, self.intermediate_size, self.head_dim_
    h, kv = self.num_attention_heads, self.num_key_value_heads
    per_layer = (d * hd * (2 * h + 2 * kv) + 3 * d * i + (4 if self.sandwich_norms else 2) * d
                 + (hd * (h + 2 * kv) if self.qkv_bias else 0) + (2 * hd if self.qk_norm else 0))
    head = 0 if self.tie_word_embeddings else self.vocab_size * d
    return self.vocab_size * d + head + d + self.num_hidden_layers * per_layer

  def inv_freq(self, local: bool = False) -> np.ndarray:
    """RoPE inverse frequencies [hd/2] in float64, with linear or Llama-3 scaling applied.

    local: of sliding layers, whose RoPE (when rope_local_theta is set) is the default one with that base."""
    hd = self.head_dim_
    theta = self.rope_local_theta if local and self.rope_local_theta is not None else self.rope_theta
    inv = 1.0 / (theta ** (np.arange(0, hd, 2, dtype=np.int64).astype(np.float32) / hd))
    inv = inv.astype(np.float64)
    if local and self.rope_local_theta is not None:
      return inv
    if self.rope_type == "linear":
      return inv / self.rope_factor
    if self.rope_type == "llama3":
      old = self.rope_original_max_position
      low_wavelen = old / self.rope_low_freq_factor
      high_wavelen = old / self.rope_high_freq_factor
      wavelen = 2 * math.pi / inv
      scaled = np.where(wavelen > low_wavelen, inv / self.rope_factor, inv)
      smooth = (old / wavelen - self.rope_low_freq_factor) / (self.rope_high_freq_factor - self.rope_low_freq_factor)
      smoothed = (1 - smooth) * scaled / self.rope_factor + smooth * scaled
      medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
      return np.where(medium, smoothed, scaled)
    return inv

  @classmethod
  def from_hf_config(cls, hf: Mapping[str, Any], **overrides) -> "LlamaConfig":
    """Read a HF `config.json` dict through its family (`model_type`); unknown families raise in one line."""
    fields = families.fields_from_hf(hf)
    fields["layer_types"] = tuple(fields.get("layer_types") or ())
    fields.update(overrides)
    return cls(**fields)

  def to_hf_config(self) -> dict:
    """The HF `config.json` dict of this config's family (new `rope_parameters` layout)."""
    return families.family(self.model_type).to_hf(self)

  @classmethod
  def from_json_file(cls, path: str, **overrides) -> "LlamaConfig":
    """Read `config.json` from a local path or fsspec URL."""
    import fsspec
    with fsspec.open(path, "r") as f:
      return cls.from_hf_config(json.load(f), **overrides)


def attention_unsupported(cfg: LlamaConfig, impl: str, where: str, head_dim: int, dtype: str) -> str | None:
  """Why attention kernel `impl` cannot serve `cfg` on platform `where` (tpu | gpu | cpu) in compute `dtype`
  (a dtype name), None when it can. JAX-free: the model (models/llama/kernels.py) and `jaxpod plan` both ask."""
  if impl == "splash":
    if where not in ("tpu", "cpu"):
      return f"splash is a TPU kernel (interpreted on CPU), and this program compiles for {where}"
    return None
  if impl == "cudnn":
    if where != "gpu":
      return f"cuDNN attention needs a GPU, and this program compiles for {where}"
    if cfg.attn_logit_softcapping is not None:
      return f"cuDNN attention has no logit soft cap (attn_logit_softcapping={cfg.attn_logit_softcapping})"
    if dtype not in ("bfloat16", "float16"):
      return f"cuDNN attention computes in bfloat16 or float16, not {dtype} (model.dtype)"
    if head_dim % 8 or head_dim > 128:
      return f"cuDNN's flash attention needs head_dim a multiple of 8 and <= 128, not {head_dim}"
  return None


def attention_kernel(cfg: LlamaConfig, where: str, head_dim: int, dtype: str) -> str:
  """The kernel that runs: `cfg.attention`, or for `auto` the platform's kernel when it serves the model, else xla.
  A forced kernel that cannot serve the model raises one line naming `model.attention`."""
  if cfg.attention == "auto":
    impl = {"tpu": "splash", "gpu": "cudnn"}.get(where, "xla")
    return impl if attention_unsupported(cfg, impl, where, head_dim, dtype) is None else "xla"
  why = attention_unsupported(cfg, cfg.attention, where, head_dim, dtype)
  if why:
    raise ValueError(f"model.attention={cfg.attention!r} cannot serve this model: {why}; use 'auto' or 'xla'")
  return cfg.attention


def tiny(**overrides) -> LlamaConfig:
  """A test-sized config: hidden 64, 2 layers, GQA 4/2, vocab 256+."""
  base = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
  return dataclasses.replace(base, **overrides)
