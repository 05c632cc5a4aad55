"""Gemma 3 text (`gemma3_text`): (1 + w) RMSNorms, scaled embeddings, GELU-tanh MLP, q/k norms, four norms per
block, query_pre_attn_scalar, sliding layers with their own RoPE base (5 local : 1 global by default)."""
from __future__ import annotations

from jaxpod.models.llama.families import common

MODEL_TYPE = "gemma3_text"
ARCHITECTURE = "Gemma3ForCausalLM"
PATTERN = 6  # default sliding_window_pattern: every 6th layer is global


def _ropes(hf) -> tuple[dict, dict]:
  """(global, local) RoPE dicts: new per-layer-type `rope_parameters`, or old rope_theta / rope_local_base_freq."""
  rope = hf.get("rope_parameters") or {}
  if common.FULL in rope or common.SLIDING in rope:
    return dict(rope.get(common.FULL) or {}), dict(rope.get(common.SLIDING) or {})
  full = dict(hf.get("rope_scaling") or {})
  full.setdefault("rope_theta", hf.get("rope_theta", 1_000_000.0))
  return full, {"rope_type": "default", "rope_theta": hf.get("rope_local_base_freq", 10_000.0)}


def from_hf(hf) -> dict:
  """LlamaConfig fields of a Gemma 3 text config.json."""
  for key in ("final_logit_softcapping", "attn_logit_softcapping"):
    common.refuse_unless(hf, key, None, "logit soft-capping is not implemented (Gemma 3 releases set it null)")
  common.refuse_unless(hf, "use_bidirectional_attention", (False, None), "jaxpod decodes causally only")
  common.refuse_unless(hf, "attention_bias", False, "jaxpod's Gemma 3 has no attention biases")
  common.refuse_unless(hf, "hidden_activation", "gelu_pytorch_tanh", "jaxpod's Gemma 3 supports gelu_pytorch_tanh")
  full, local = _ropes(hf)
  if local.get("rope_type", "default") != "default":
    raise ValueError(f"config.json rope_parameters.sliding_attention.rope_type={local['rope_type']!r} "
                     "(gemma3_text): the local layers' RoPE must be default")
  pattern = hf.get("sliding_window_pattern", PATTERN)
  kinds = common.window_layers(hf, hf["num_hidden_layers"],
                               lambda i: common.SLIDING if (i + 1) % pattern else common.FULL)
  return {**common.base_fields(hf, MODEL_TYPE, tie_default=True), **common.rope_fields(full, hf),
          "rope_local_theta": float(local.get("rope_theta", 10_000.0)),
          "sliding_window": hf.get("sliding_window", 4096), "layer_types": kinds,
          "query_pre_attn_scalar": float(hf.get("query_pre_attn_scalar", 256)),
          "hidden_act": "gelu_pytorch_tanh", "qk_norm": True, "norm_plus_one": True, "scale_embeddings": True,
          "sandwich_norms": True}


def to_hf(cfg) -> dict:
  """A Gemma 3 text config.json."""
  rope = {common.FULL: common.rope_out(cfg),
          common.SLIDING: {"rope_type": "default", "rope_theta": cfg.rope_local_theta}}
  return {**common.base_hf(cfg, ARCHITECTURE), "rope_parameters": rope, "hidden_activation": cfg.hidden_act,
          "sliding_window": cfg.sliding_window, "layer_types": list(cfg.layer_kinds),
          # transformers' Gemma3TextConfig types it int (a float is refused)
          "query_pre_attn_scalar": int(cfg.query_pre_attn_scalar) if float(cfg.query_pre_attn_scalar).is_integer()
          else cfg.query_pre_attn_scalar, "final_logit_softcapping": None,
          "attn_logit_softcapping": None}
