"""The model a plan is for, read through jaxpod's own config reader, and its parameters as a list of tensors.

`resolve(spec)` takes a preset name (`llama-3-70b`, `llama-3-8b`, `qwen2.5-32b`: config.json files
shipped in `jaxpod/configs/models/`), a HF `config.json` path or URL, a folder holding one, or a
jaxpod workload YAML/JSON whose `model` (or `task.model`) section gives `LlamaConfig` fields or
points at a checkpoint (`model.hf`, `task.init_from`, `task.hf`). Everything goes through
`LlamaConfig.from_hf_config` (the families' readers): plan never reads a config.json its own way.

`tensors(cfg)` lists every parameter the decoder declares: the table `models/llama/params.py` that the model's
modules create their parameters from (path in the model's state, shape, logical axes). No JAX here.
"""
from __future__ import annotations

import dataclasses
import json
from importlib import resources
from typing import Any, Mapping

from jaxpod.models.llama import params as table
from jaxpod.models.llama.config import LlamaConfig
from jaxpod.models.llama.params import Tensor

ITEMSIZE = {"float32": 4, "bfloat16": 2}


def presets() -> dict[str, str]:
  """Shipped model names -> their config.json text."""
  folder = resources.files("jaxpod.configs").joinpath("models")
  return {f.name[:-len(".json")]: f.read_text() for f in folder.iterdir() if f.name.endswith(".json")}


def _read_text(url: str) -> str:
  import fsspec
  with fsspec.open(url, "r") as f:
    return f.read()


def _is_dir(url: str) -> bool:
  import fsspec
  fs, path = fsspec.core.url_to_fs(url)
  return fs.isdir(path)


def _parse(text: str, where: str) -> Mapping[str, Any]:
  import yaml
  try:
    data = yaml.safe_load(text)  # YAML is a superset of JSON
  except yaml.YAMLError as e:
    raise ValueError(f"model={where}: not JSON or YAML ({str(e).splitlines()[0]})") from None
  if not isinstance(data, Mapping):
    raise ValueError(f"model={where}: expected a config.json object or a workload config with a model section")
  return data


def _section(data: Mapping[str, Any]) -> tuple[str, Any] | None:
  """(where, section) of a workload config: `model` or `task.model`, with any checkpoint pointer it names."""
  task = data.get("task") if isinstance(data.get("task"), Mapping) else {}
  for where, pointer in (("task.init_from", task.get("init_from")), ("task.hf", task.get("hf"))):
    if pointer:
      return where, pointer
  for where, sec in (("model", data.get("model")), ("task.model", task.get("model"))):
    if isinstance(sec, Mapping):
      return where, sec
  return None


def from_dict(data: Mapping[str, Any], where: str, depth: int = 0) -> LlamaConfig:
  """A HF config.json dict, or a workload config with a model section, as a LlamaConfig."""
  if "model_type" in data or "architectures" in data or "hidden_size" in data and "model" not in data:
    return LlamaConfig.from_hf_config(data)
  found = _section(data)
  if found is None:
    raise ValueError(f"model={where}: neither a config.json (no model_type/hidden_size) nor a workload config "
                     "with a model: or task.model: section")
  key, sec = found
  if isinstance(sec, str):
    return resolve(sec, depth + 1)
  if sec.get("hf"):
    return resolve(sec["hf"], depth + 1)
  known = {f.name for f in dataclasses.fields(LlamaConfig)}
  fields = {k: (tuple(v) if isinstance(v, list) else v) for k, v in sec.items() if k in known}
  try:
    return LlamaConfig(**fields)
  except (TypeError, ValueError) as e:
    raise ValueError(f"model={where}: {key}: {e}") from None


def resolve(spec: str, depth: int = 0) -> LlamaConfig:
  """A LlamaConfig from a preset name, a config.json path/URL, a folder holding one, or a workload config."""
  if depth > 2:
    raise ValueError(f"model={spec}: a model section points at another config more than twice")
  if not spec:
    raise ValueError(f"model is required: a preset ({', '.join(sorted(presets()))}), a config.json path or URL, "
                     "a checkpoint folder, or a workload config")
  shipped = presets()
  if spec.lower() in shipped:
    return from_dict(json.loads(shipped[spec.lower()]), spec)
  try:
    url = spec.rstrip("/") + "/config.json" if _is_dir(spec) else spec
    text = _read_text(url)
  except (FileNotFoundError, OSError) as e:
    raise ValueError(f"model={spec}: no such preset, file or folder with config.json ({type(e).__name__}); "
                     f"presets: {', '.join(sorted(shipped))}") from None
  return from_dict(_parse(text, spec), spec, depth)


def tensors(cfg: LlamaConfig, stacked_layers: bool = True) -> list[Tensor]:
  """Every parameter of jaxpod's decoder for `cfg` (paths as in its nnx state: block weights stacked [L, ...]; or
  one tensor per layer, as a checkpoint holds them)."""
  return table.tensors(cfg, stacked_layers)


def kv_bytes_per_token(cfg: LlamaConfig) -> int:
  """K and V of every layer for one token, in the model's dtype (what every KV layout stores)."""
  return table.kv_bytes_per_token(cfg, ITEMSIZE[cfg.dtype])
