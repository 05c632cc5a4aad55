"""PEFT's adapter files <-> jaxpod's LoRA adapters (`lora.py`), local or any storage URL (gs://, memory://).

    peft_io.save_adapter(model, "gs://bucket/run/adapter")      # adapter_config.json + adapter_model.safetensors
    model = peft_io.load_adapter(hf_io.load(base, mesh), "gs://bucket/run/adapter", mesh=mesh)
    peft_io.check_adapter(url, cfg)                              # before JAX: one line naming what is wrong

The files are the ones `peft` writes and reads (`PeftModel.from_pretrained`, `save_pretrained`):
tensors `base_model.model.model.layers.{i}.{self_attn|mlp}.{proj}.lora_A.weight` [r, in] and
`...lora_B.weight` [out, r] (torch's [out, in] convention: jaxpod's A [in, r] and B [r, out]
transposed), and `adapter_config.json` with `r`, `lora_alpha`, `use_rslora`, `target_modules`.
PEFT settings that change the math and that jaxpod does not run (DoRA, biases, per-layer ranks,
layer subsets, fan_in_fan_out, modules_to_save) are refused by name rather than dropped.
"""
from __future__ import annotations

import json
import re

import numpy as np

from jaxpod.models.llama.config import LlamaConfig
from jaxpod.runtime import storage

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PREFIX = "base_model.model.model.layers."
_NAME = re.compile(r"^base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")
# PEFT config keys whose non-default values change what the adapter computes, and those defaults.
_REFUSED = {"use_dora": (False, None), "bias": ("none", None), "fan_in_fan_out": (False, None),
            "rank_pattern": ({}, None), "alpha_pattern": ({}, None), "layers_to_transform": (None, []),
            "modules_to_save": (None, []), "lora_bias": (False, None), "target_parameters": (None, []),
            "exclude_modules": (None, [])}


def tensor_name(layer: int, name: str, which: str) -> str:
  """PEFT's saved name of one adapter matrix: which is 'A' or 'B'."""
  from jaxpod.models.llama.lora import owner
  return f"{PREFIX}{layer}.{owner(name)}.{name}.lora_{which}.weight"


def adapter_config(lcfg, base_model: str = "") -> dict:
  """The adapter_config.json dict of a LoraConfig (what peft needs to rebuild it)."""
  return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": lcfg.rank, "lora_alpha": lcfg.alpha,
          "lora_dropout": 0.0, "target_modules": list(lcfg.target_modules), "bias": "none",
          "use_rslora": lcfg.rslora, "fan_in_fan_out": False, "use_dora": False, "inference_mode": True,
          "base_model_name_or_path": base_model}


def read_config(url: str):
  """LoraConfig from `<url>/adapter_config.json`; PEFT settings jaxpod cannot run raise in one line."""
  from jaxpod.models.llama.lora import TARGETS, LoraConfig
  where = storage.join(url, CONFIG_FILE)
  if not storage.exists(where):
    raise ValueError(f"{where} not found: a PEFT adapter folder holds {CONFIG_FILE} and {WEIGHTS_FILE}")
  raw = json.loads(storage.read_text(where))
  if raw.get("peft_type", "LORA") != "LORA":
    raise ValueError(f"{where}: peft_type={raw['peft_type']!r}; jaxpod loads LORA adapters only")
  for key, allowed in _REFUSED.items():
    if key in raw and raw[key] not in allowed:
      raise ValueError(f"{where}: {key}={raw[key]!r} is not supported by jaxpod's LoRA (allowed: {allowed[0]!r})")
  targets = raw.get("target_modules") or []
  if targets == "all-linear":
    targets = list(TARGETS)
  if isinstance(targets, str):
    raise ValueError(f"{where}: target_modules={targets!r} is a regex; jaxpod reads a list of names from {TARGETS}")
  try:
    return LoraConfig(rank=int(raw["r"]), alpha=float(raw["lora_alpha"]), rslora=bool(raw.get("use_rslora", False)),
                      target_modules=tuple(sorted(set(targets), key=_order(TARGETS))))
  except ValueError as e:
    raise ValueError(f"{where}: {e}") from None


def _order(names):
  return lambda n: names.index(n) if n in names else len(names)


def _header(url: str) -> dict[str, tuple[int, ...]]:
  """tensor name -> shape from the safetensors header (8-byte length + JSON), without reading the tensors."""
  fs, path = storage.filesystem(url)
  n = int.from_bytes(fs.cat_file(path, start=0, end=8), "little")
  head = json.loads(fs.cat_file(path, start=8, end=8 + n))
  return {k: tuple(v["shape"]) for k, v in head.items() if k != "__metadata__"}


def check_adapter(url: str, cfg: LlamaConfig):
  """The adapter's LoraConfig, after checking its tensors' names and shapes against `cfg` (no JAX needed)."""
  from jaxpod.models.llama.lora import shapes
  lcfg = read_config(url)
  where = storage.join(url, WEIGHTS_FILE)
  if not storage.exists(where):
    raise ValueError(f"{where} not found next to {CONFIG_FILE}")
  stored = _header(where)
  table = shapes(cfg)
  wanted = {}
  for i in range(cfg.num_hidden_layers):
    for name in lcfg.target_modules:
      n_in, n_out = table[name][:2]
      wanted[tensor_name(i, name, "A")] = (lcfg.rank, n_in)
      wanted[tensor_name(i, name, "B")] = (n_out, lcfg.rank)
  missing, unused = sorted(set(wanted) - set(stored)), sorted(set(stored) - set(wanted))
  if missing or unused:
    what = (f"lacks {missing[:3]}" if missing else f"has {unused[:3]} that a {cfg.num_hidden_layers}-layer "
            f"{cfg.model_type} model with target_modules={list(lcfg.target_modules)} does not use")
    raise ValueError(f"adapter {where} {what}{' ...' if len(missing or unused) > 3 else ''}; it was saved for "
                     "another model or adapter_config.json does not match it")
  for k, shape in wanted.items():
    if stored[k] != shape:
      raise ValueError(f"adapter tensor {k} in {where} has shape {stored[k]}; this model (config.json) needs "
                       f"{shape}: the adapter was trained on another base")
  return lcfg


def load_adapter(model, url: str, mesh=None, rules=None):
  """Attach the PEFT adapter at `url` to `model` (a base without adapters) and return it (checked first)."""
  from safetensors.numpy import load as st_load
  from jaxpod.models.llama import lora
  lcfg = check_adapter(url, model.cfg)
  tensors = st_load(storage.read_bytes(storage.join(url, WEIGHTS_FILE)))
  lora.attach(model, lcfg, mesh=mesh, rules=rules)
  values = {}
  for i in range(model.cfg.num_hidden_layers):
    for name in lcfg.target_modules:
      values[(i, name)] = (tensors[tensor_name(i, name, "A")].T, tensors[tensor_name(i, name, "B")].T)
  lora.set_adapters(model, values)
  return model


def _whole(x) -> np.ndarray:
  """The whole (small) adapter matrix on this host: a collective when it spans hosts, so every host calls it."""
  import jax
  if getattr(x, "is_fully_addressable", True):
    return np.asarray(jax.device_get(x))
  from jax.experimental import multihost_utils
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def save_adapter(model, url: str, base_model: str = "") -> None:
  """Write the model's adapters as PEFT's files at `url`; every host calls it (a gather), the leader writes."""
  import jax
  from safetensors.numpy import save as st_save
  from jaxpod.models.llama import lora
  lcfg = lora.lora_config(model)
  if lcfg is None:
    raise ValueError("this model has no LoRA adapters to save; attach them first (lora.attach)")
  tensors = {}
  for (i, name), (a, b) in lora.adapters(model).items():
    tensors[tensor_name(i, name, "A")] = np.ascontiguousarray(_whole(a).T)
    tensors[tensor_name(i, name, "B")] = np.ascontiguousarray(_whole(b).T)
  if jax.process_index() != 0:
    return
  storage.makedirs(url)
  storage.write_bytes(storage.join(url, WEIGHTS_FILE), st_save(tensors, metadata={"format": "pt"}))
  storage.write_text(storage.join(url, CONFIG_FILE), json.dumps(adapter_config(lcfg, base_model), indent=2))
