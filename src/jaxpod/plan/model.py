"""The model a plan is for, read through jaxpod's own config reader, and its parameters as a list of tensors.

`resolve(spec)` takes a preset name (`llama-3-70b`, `llama-3-8b`, `qwen2.5-32b`: config.json files
shipped in `jaxpod/configs/models/`), a HF `config.json` path or URL, a folder holding one, or a
jaxpod workload YAML/JSON whose `model` (or `task.model`) section gives `LlamaConfig` fields or
points at a checkpoint (`model.hf`, `task.init_from`, `task.hf`). Everything goes through
`LlamaConfig.from_hf_config` (the families' readers): plan never reads a config.json its own way.

`tensors(cfg)` lists every parameter the decoder declares (`models/llama/model.py`): its path in the
model's state, shape and logical axes. No JAX here; a test checks the list against the model's
abstract state leaf by leaf.
"""
from __future__ import annotations

import dataclasses
import json
from importlib import resources
from typing import Any, Mapping

from jaxpod.models.llama.config import LlamaConfig

ITEMSIZE = {"float32": 4, "bfloat16": 2}


@dataclasses.dataclass(frozen=True)
class Tensor:
  """One parameter: its path in the model's state, shape, logical axes."""

  name: str
  shape: tuple[int, ...]
  axes: tuple[str | None, ...]

  @property
  def size(self) -> int:
    n = 1
    for d in self.shape:
      n *= d
    return n


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


def tensors(cfg: LlamaConfig) -> list[Tensor]:
  """Every parameter of jaxpod's decoder for `cfg`, in the model's declaration (paths as in its nnx state)."""
  d, i, h, k, e, v = (cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                      cfg.head_dim_, cfg.vocab_size)
  out = [Tensor("embed_tokens", (v, d), ("vocab", "embed"))]
  for n in range(cfg.num_hidden_layers):
    p = f"layers.{n}."
    block = [Tensor(p + "input_layernorm", (d,), ("act_embed",)),
             Tensor(p + "self_attn.q_proj", (d, h, e), ("embed", "heads", "head_dim")),
             Tensor(p + "self_attn.k_proj", (d, k, e), ("embed", "kv_heads", "head_dim")),
             Tensor(p + "self_attn.v_proj", (d, k, e), ("embed", "kv_heads", "head_dim")),
             Tensor(p + "self_attn.o_proj", (h, e, d), ("heads", "head_dim", "embed"))]
    if cfg.qkv_bias:
      block += [Tensor(p + "self_attn.q_bias", (h, e), ("heads", "head_dim")),
                Tensor(p + "self_attn.k_bias", (k, e), ("kv_heads", "head_dim")),
                Tensor(p + "self_attn.v_bias", (k, e), ("kv_heads", "head_dim"))]
    if cfg.qk_norm:
      block += [Tensor(p + "self_attn.q_norm", (e,), ("head_dim",)), Tensor(p + "self_attn.k_norm", (e,), ("head_dim",))]
    block.append(Tensor(p + "post_attention_layernorm", (d,), ("act_embed",)))
    if cfg.sandwich_norms:
      block += [Tensor(p + "pre_feedforward_layernorm", (d,), ("act_embed",)),
                Tensor(p + "post_feedforward_layernorm", (d,), ("act_embed",))]
    block += [Tensor(p + "mlp.gate_proj", (d, i), ("embed", "mlp")), Tensor(p + "mlp.up_proj", (d, i), ("embed", "mlp")),
              Tensor(p + "mlp.down_proj", (i, d), ("mlp", "embed"))]
    out += block
  out.append(Tensor("norm", (d,), ("act_embed",)))
  if not cfg.tie_word_embeddings:
    out.append(Tensor("lm_head", (d, v), ("embed", "vocab")))
  return out


def kv_bytes_per_token(cfg: LlamaConfig) -> int:
  """K and V of every layer for one token, in the model's dtype (what every KV layout stores)."""
  return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim_ * ITEMSIZE[cfg.dtype]
