"""Mistral: Llama-shaped, with an optional sliding window over every layer."""
from __future__ import annotations

from jaxpod.models.llama.families import common, llama

MODEL_TYPE = "mistral"
ARCHITECTURE = "MistralForCausalLM"


def from_hf(hf) -> dict:
  """LlamaConfig fields of a Mistral config.json (sliding_window null: full attention)."""
  window = hf.get("sliding_window")
  kinds = (common.SLIDING if window else common.FULL,) * hf["num_hidden_layers"]
  return {**llama.from_hf(hf), "model_type": MODEL_TYPE, "sliding_window": window, "layer_types": kinds}


def to_hf(cfg) -> dict:
  """A Mistral config.json."""
  return {**llama.to_hf(cfg), "architectures": [ARCHITECTURE], "sliding_window": cfg.sliding_window}
