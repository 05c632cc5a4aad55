"""Qwen3: no q/k/v bias, explicit head_dim, RMSNorm over head_dim on each query and key head before RoPE."""
from __future__ import annotations

from jaxpod.models.llama.families import common, qwen2

MODEL_TYPE = "qwen3"
ARCHITECTURE = "Qwen3ForCausalLM"


def from_hf(hf) -> dict:
  """LlamaConfig fields of a Qwen3 config.json."""
  common.refuse_unless(hf, "attention_bias", False, "jaxpod's Qwen3 has no attention biases")
  common.refuse_unless(hf, "hidden_act", "silu", "jaxpod's Qwen3 supports silu only")
  return {**common.base_fields(hf, MODEL_TYPE), **common.rope_fields(common.rope_dict(hf), hf),
          **qwen2.window_fields(hf), "qk_norm": True}


def to_hf(cfg) -> dict:
  """A Qwen3 config.json."""
  return {**common.base_hf(cfg, ARCHITECTURE), "rope_parameters": common.rope_out(cfg), "hidden_act": "silu",
          **qwen2.window_out(cfg)}
