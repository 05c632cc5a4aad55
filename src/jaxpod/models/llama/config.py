"""`LlamaConfig`: the shape of a Llama-family decoder, read from a Hugging Face `config.json`.

Both config generations are read: newer files carry `rope_parameters` (with `rope_theta`,
`rope_type` and scaling fields) and `head_dim`; older ones carry top-level `rope_theta` and
an optional `rope_scaling` dict. RoPE types supported: `default`, `linear` and `llama3`.
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Mapping

import numpy as np

ROPE_TYPES = ("default", "linear", "llama3")
DTYPES = ("float32", "bfloat16")


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
  dtype: str = "float32"  # compute and parameter dtype: float32 | bfloat16

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
    if not isinstance(self.eos_token_id, tuple):
      raise ValueError(f"LlamaConfig.eos_token_id must be a tuple of ints, got {self.eos_token_id!r}")

  @property
  def head_dim_(self) -> int:
    """The per-head width actually used."""
    return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_attention_heads

  @property
  def jnp_dtype(self):
    import jax.numpy as jnp
    return jnp.dtype(self.dtype)

  def num_params(self) -> int:
    """Parameter count (embedding counted once when tied)."""
    d, i, hd = self.hidden_size, self.intermediate_size, self.head_dim_
    h, kv = self.num_attention_heads, self.num_key_value_heads
    per_layer = d * hd * (2 * h + 2 * kv) + 3 * d * i + 2 * d
    head = 0 if self.tie_word_embeddings else self.vocab_size * d
    return self.vocab_size * d + head + d + self.num_hidden_layers * per_layer

  def inv_freq(self) -> np.ndarray:
    """RoPE inverse frequencies [hd/2] in float64, with linear or Llama-3 scaling applied."""
    hd = self.head_dim_
    inv = 1.0 / (self.rope_theta ** (np.arange(0, hd, 2, dtype=np.int64).astype(np.float32) / hd))
    inv = inv.astype(np.float64)
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
    """Read a HF Llama `config.json` dict (new `rope_parameters` or old `rope_theta`/`rope_scaling`)."""
    rope = dict(hf.get("rope_parameters") or {})
    old_scaling = hf.get("rope_scaling") or {}
    if not rope:
      rope = dict(old_scaling)
      rope.setdefault("rope_theta", hf.get("rope_theta", 10000.0))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    eos = hf.get("eos_token_id")
    eos = () if eos is None else (tuple(int(e) for e in eos) if isinstance(eos, (list, tuple)) else (int(eos),))
    fields = dict(
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"],
        num_hidden_layers=hf["num_hidden_layers"],
        num_attention_heads=hf["num_attention_heads"],
        num_key_value_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
        head_dim=hf.get("head_dim"),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
        rope_type=rope_type,
        rope_factor=float(rope.get("factor", 1.0)),
        rope_low_freq_factor=float(rope.get("low_freq_factor", 1.0)),
        rope_high_freq_factor=float(rope.get("high_freq_factor", 4.0)),
        rope_original_max_position=int(rope.get("original_max_position_embeddings",
                                                hf.get("max_position_embeddings", 8192))),
        max_position_embeddings=int(hf.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_id=eos,
        pad_token_id=hf.get("pad_token_id"),
        # the stored dtype becomes the compute dtype unless overridden (float16 computes in float32)
        dtype="bfloat16" if (hf.get("dtype") or hf.get("torch_dtype")) == "bfloat16" else "float32",
    )
    for bad in ("attention_bias", "mlp_bias"):
      if hf.get(bad):
        raise ValueError(f"config.json sets {bad}=true; jaxpod's Llama has no biases")
    if hf.get("hidden_act", "silu") != "silu":
      raise ValueError(f"config.json hidden_act={hf['hidden_act']!r}; jaxpod's Llama supports silu only")
    fields.update(overrides)
    return cls(**fields)

  def to_hf_config(self) -> dict:
    """A HF `config.json` dict (new `rope_parameters` layout) for this config."""
    rope: dict[str, Any] = {"rope_type": self.rope_type, "rope_theta": self.rope_theta}
    if self.rope_type in ("linear", "llama3"):
      rope["factor"] = self.rope_factor
    if self.rope_type == "llama3":
      rope.update(low_freq_factor=self.rope_low_freq_factor, high_freq_factor=self.rope_high_freq_factor,
                  original_max_position_embeddings=self.rope_original_max_position)
    eos = list(self.eos_token_id)
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
        "intermediate_size": self.intermediate_size, "num_hidden_layers": self.num_hidden_layers,
        "num_attention_heads": self.num_attention_heads, "num_key_value_heads": self.num_key_value_heads,
        "head_dim": self.head_dim_, "rms_norm_eps": self.rms_norm_eps, "rope_parameters": rope,
        "max_position_embeddings": self.max_position_embeddings, "hidden_act": "silu",
        "tie_word_embeddings": self.tie_word_embeddings, "bos_token_id": self.bos_token_id,
        "eos_token_id": eos[0] if len(eos) == 1 else (eos or None), "pad_token_id": self.pad_token_id,
        "attention_bias": False, "mlp_bias": False, "dtype": self.dtype,
    }

  @classmethod
  def from_json_file(cls, path: str, **overrides) -> "LlamaConfig":
    """Read `config.json` from a local path or fsspec URL."""
    import fsspec
    with fsspec.open(path, "r") as f:
      return cls.from_hf_config(json.load(f), **overrides)


def tiny(**overrides) -> LlamaConfig:
  """A test-sized config: hidden 64, 2 layers, GQA 4/2, vocab 256+."""
  base = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
  return dataclasses.replace(base, **overrides)
