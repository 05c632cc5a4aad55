"""Qwen2 and Qwen2.5: q/k/v biases; sliding window on layers >= max_window_layers when use_sliding_window."""
from __future__ import annotations

from jaxpod.models.llama.families import common

MODEL_TYPE = "qwen2"
ARCHITECTURE = "Qwen2ForCausalLM"


def window_fields(hf) -> dict:
  """sliding_window and layer_types of a Qwen config.json (both Qwen2 and Qwen3 read them this way)."""
  window = hf.get("sliding_window") if hf.get("use_sliding_window") else None
  first = hf.get("max_window_layers", hf["num_hidden_layers"])
  kinds = common.window_layers(hf, hf["num_hidden_layers"],
                               lambda i: common.SLIDING if window and i >= first else common.FULL)
  if common.SLIDING in kinds and not window:
    raise ValueError(f"config.json layer_types has sliding layers but use_sliding_window={hf.get('use_sliding_window')}"
                     f", sliding_window={hf.get('sliding_window')}; set both")
  return {"sliding_window": window, "layer_types": kinds}


def window_out(cfg) -> dict:
  """The config.json keys that describe cfg's sliding layers, Qwen style."""
  kinds = cfg.layer_kinds
  sliding = [i for i, k in enumerate(kinds) if k == common.SLIDING]
  return {"use_sliding_window": bool(sliding), "sliding_window": cfg.sliding_window,
          "max_window_layers": sliding[0] if sliding else cfg.num_hidden_layers, "layer_types": list(kinds)}


def from_hf(hf) -> dict:
  """LlamaConfig fields of a Qwen2 config.json."""
  common.refuse_unless(hf, "hidden_act", "silu", "jaxpod's Qwen2 supports silu only")
  return {**common.base_fields(hf, MODEL_TYPE), **common.rope_fields(common.rope_dict(hf), hf),
          **window_fields(hf), "qkv_bias": True}


def to_hf(cfg) -> dict:
  """A Qwen2 config.json."""
  return {**common.base_hf(cfg, ARCHITECTURE), "rope_parameters": common.rope_out(cfg), "hidden_act": "silu",
          **window_out(cfg)}
