"""Decoder families, picked by `config.json`'s `model_type`: one module per family, one line each below.

A family module knows only how its HF `config.json` maps onto `LlamaConfig`'s fields (the
switches of the one shared decoder in `model.py`) and back:

  MODEL_TYPE = "qwen3"                      # config.json model_type
  ARCHITECTURE = "Qwen3ForCausalLM"         # config.json architectures[0] on export
  def from_hf(hf: dict) -> dict             # LlamaConfig fields; raises on a feature it cannot run
  def to_hf(cfg) -> dict                    # the config.json transformers reads back

No JAX computation here (no backend starts): workloads check the family before JAX initialises (invariant 7).
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, Mapping

from jaxpod.models.llama.families import gemma3, llama, mistral, qwen2, qwen3

FAMILIES: dict[str, ModuleType] = {m.MODEL_TYPE: m for m in (llama, qwen2, qwen3, gemma3, mistral)}
SUPPORTED = tuple(FAMILIES)
_HINTS = {"gemma3": "a multimodal Gemma 3 checkpoint: export its text model (model_type gemma3_text)",
          "qwen2_5": "Qwen2.5 checkpoints say model_type qwen2"}


def family(model_type: str | None) -> ModuleType:
  """The family module of a config.json `model_type` (missing: llama), or a one-line error naming the supported ones."""
  mt = model_type or "llama"
  if mt not in FAMILIES:
    hint = f" ({_HINTS[mt]})" if mt in _HINTS else ""
    raise ValueError(f"config.json model_type={mt!r} is not supported{hint}; jaxpod loads model_type "
                     f"{', '.join(SUPPORTED)}")
  return FAMILIES[mt]


def fields_from_hf(hf: Mapping[str, Any]) -> dict:
  """LlamaConfig fields of a HF config.json dict, through its family."""
  return family(hf.get("model_type")).from_hf(hf)
