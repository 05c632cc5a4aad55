"""What every family's config.json shares with Llama's: sizes, special ids, dtype, RoPE, sliding layers."""
from __future__ import annotations

from typing import Any, Mapping

FULL, SLIDING = "full_attention", "sliding_attention"


def refuse_unless(hf: Mapping[str, Any], key: str, allowed, why: str) -> None:
  """Raise naming `key` when config.json sets it to something other than `allowed` (a value or a tuple)."""
  allowed = allowed if isinstance(allowed, tuple) else (allowed,)
  if key in hf and hf[key] not in allowed:
    raise ValueError(f"config.json {key}={hf[key]!r} ({hf.get('model_type', 'llama')}): {why}")


def _eos(v) -> tuple[int, ...]:
  return () if v is None else (tuple(int(e) for e in v) if isinstance(v, (list, tuple)) else (int(v),))


def rope_fields(rope: Mapping[str, Any], hf: Mapping[str, Any]) -> dict:
  """RoPE fields from a rope dict (new `rope_parameters` or old `rope_scaling` + top-level `rope_theta`)."""
  return dict(
      rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
      rope_type=rope.get("rope_type", rope.get("type", "default")),
      rope_factor=float(rope.get("factor", 1.0)),
      rope_low_freq_factor=float(rope.get("low_freq_factor", 1.0)),
      rope_high_freq_factor=float(rope.get("high_freq_factor", 4.0)),
      rope_original_max_position=int(rope.get("original_max_position_embeddings",
                                              hf.get("max_position_embeddings", 8192))))


def rope_dict(hf: Mapping[str, Any]) -> dict:
  """The one RoPE dict of a single-RoPE family, new layout or old."""
  rope = dict(hf.get("rope_parameters") or {})
  if not rope:
    rope = dict(hf.get("rope_scaling") or {})
    rope.setdefault("rope_theta", hf.get("rope_theta", 10000.0))
  return rope


def base_fields(hf: Mapping[str, Any], model_type: str, tie_default: bool = False) -> dict:
  """Sizes, norms, special ids and dtype that every family reads the same way."""
  return dict(
      model_type=model_type,
      vocab_size=hf["vocab_size"],
      hidden_size=hf["hidden_size"],
      intermediate_size=hf["intermediate_size"],
      num_hidden_layers=hf["num_hidden_layers"],
      num_attention_heads=hf["num_attention_heads"],
      num_key_value_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
      head_dim=hf.get("head_dim"),
      rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
      max_position_embeddings=int(hf.get("max_position_embeddings", 2048)),
      tie_word_embeddings=bool(hf.get("tie_word_embeddings", tie_default)),
      bos_token_id=hf.get("bos_token_id"),
      eos_token_id=_eos(hf.get("eos_token_id")),
      pad_token_id=hf.get("pad_token_id"),
      # the stored dtype becomes the compute dtype unless overridden (float16 computes in float32)
      dtype="bfloat16" if (hf.get("dtype") or hf.get("torch_dtype")) == "bfloat16" else "float32",
  )


def rope_out(cfg) -> dict:
  """The new-layout `rope_parameters` dict of cfg's (global) RoPE."""
  rope: dict[str, Any] = {"rope_type": cfg.rope_type, "rope_theta": cfg.rope_theta}
  if cfg.rope_type in ("linear", "llama3"):
    rope["factor"] = cfg.rope_factor
  if cfg.rope_type == "llama3":
    rope.update(low_freq_factor=cfg.rope_low_freq_factor, high_freq_factor=cfg.rope_high_freq_factor,
                original_max_position_embeddings=cfg.rope_original_max_position)
  return rope


def base_hf(cfg, architecture: str) -> dict:
  """The config.json keys every family writes."""
  eos = list(cfg.eos_token_id)
  return {
      "architectures": [architecture], "model_type": cfg.model_type,
      "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
      "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_hidden_layers,
      "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
      "head_dim": cfg.head_dim_, "rms_norm_eps": cfg.rms_norm_eps,
      "max_position_embeddings": cfg.max_position_embeddings,
      "tie_word_embeddings": cfg.tie_word_embeddings, "bos_token_id": cfg.bos_token_id,
      "eos_token_id": eos[0] if len(eos) == 1 else (eos or None), "pad_token_id": cfg.pad_token_id,
      "attention_bias": False, "dtype": cfg.dtype,
  }


def window_layers(hf: Mapping[str, Any], num_layers: int, derive) -> tuple[str, ...]:
  """Per-layer attention kinds: config.json `layer_types` if written, else `derive(i)` -> kind."""
  kinds = hf.get("layer_types") or [derive(i) for i in range(num_layers)]
  return tuple(kinds)
