"""Llama (1, 2, 3.x) and SmolLM: the baseline decoder, no switches."""
from __future__ import annotations

from jaxpod.models.llama.families import common

MODEL_TYPE = "llama"
ARCHITECTURE = "LlamaForCausalLM"


def from_hf(hf) -> dict:
  """LlamaConfig fields of a Llama config.json."""
  common.refuse_unless(hf, "attention_bias", False, "jaxpod's Llama has no attention biases")
  common.refuse_unless(hf, "mlp_bias", False, "jaxpod's Llama has no MLP biases")
  common.refuse_unless(hf, "hidden_act", "silu", "jaxpod's Llama supports silu only")
  return {**common.base_fields(hf, MODEL_TYPE), **common.rope_fields(common.rope_dict(hf), hf)}


def to_hf(cfg) -> dict:
  """A Llama config.json."""
  return {**common.base_hf(cfg, ARCHITECTURE), "rope_parameters": common.rope_out(cfg), "hidden_act": "silu",
          "mlp_bias": False}
