"""Hugging Face checkpoints of every family in `families/` <-> jaxpod `Llama`, straight into a target sharding.

`load(path, mesh)` reads `config.json` and `model.safetensors` (or the shards listed in
`model.safetensors.index.json`) from a local folder or any fsspec URL, and places every
tensor directly into the sharding that `runtime.state_shardings` gives it: each host reads
a tensor once and keeps only the shards its devices own. Missing or mis-shaped tensors
raise naming the tensor, the expected shape (from config.json) and the one found; so does
a checkpoint tensor the model would not use (a family feature jaxpod lacks must not be
dropped silently).

`save(model, path)` writes the HF layout back (config.json + model.safetensors, or shards
plus an index with `max_shard_bytes`); every host takes part in gathering sharded arrays,
the leader alone writes.

Layout: HF linear weights are [out, in]; jaxpod keeps [in..., out...] so einsums read
naturally (q_proj [D, H, E], o_proj [H, E, D], gate_proj [D, I], lm_head [D, V]).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from typing import Iterator

import fsspec
import jax
import numpy as np
from flax import nnx

from jaxpod.models.llama import model as model_lib
from jaxpod.models.llama.config import LlamaConfig
from jaxpod.runtime.sharding import DEFAULT as DEFAULT_RULES, ShardingRules, state_shardings

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# Leading "in" dims of each linear weight in jaxpod layout; absent names are copied as is.
_LINEAR_IN_DIMS = {"q_proj": 1, "k_proj": 1, "v_proj": 1, "o_proj": 2,
                   "gate_proj": 1, "up_proj": 1, "down_proj": 1, "lm_head": 1}
# Biases [heads, E] in jaxpod are flat [heads*E] `<proj>.bias` tensors in HF.
_BIAS_OF = {"q_bias": "q_proj", "k_bias": "k_proj", "v_bias": "v_proj"}
# Buffers older checkpoints stored that the config determines: read past, never used.
_DERIVED_SUFFIXES = ("rotary_emb.inv_freq",)


def hf_name(path: tuple) -> str:
  """jaxpod state path -> HF tensor name, e.g. ('layers', 0, 'mlp', 'up_proj') -> model.layers.0.mlp.up_proj.weight."""
  if path == ("lm_head",):
    return "lm_head.weight"
  if path[-1] in _BIAS_OF:
    return "model." + ".".join(str(p) for p in path[:-1]) + f".{_BIAS_OF[path[-1]]}.bias"
  return "model." + ".".join(str(p) for p in path) + ".weight"


def hf_shape(path: tuple, shape: tuple[int, ...]) -> tuple[int, ...]:
  """Shape of the HF tensor that holds a jaxpod parameter of `shape`."""
  if path[-1] in _BIAS_OF:
    return (math.prod(shape),)
  n_in = _LINEAR_IN_DIMS.get(path[-1])
  if n_in is None:
    return tuple(shape)
  return (math.prod(shape[n_in:]), math.prod(shape[:n_in]))


def from_hf(path: tuple, w: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
  """HF tensor -> jaxpod layout (a view where possible)."""
  if path[-1] in _BIAS_OF:
    return w.reshape(shape)
  return w if path[-1] not in _LINEAR_IN_DIMS else w.T.reshape(shape)


def to_hf(path: tuple, w: np.ndarray) -> np.ndarray:
  """jaxpod parameter -> HF tensor layout."""
  if path[-1] in _BIAS_OF:
    return w.reshape(-1)
  n_in = _LINEAR_IN_DIMS.get(path[-1])
  if n_in is None:
    return w
  return np.ascontiguousarray(w.reshape(math.prod(w.shape[:n_in]), -1).T)


def _check_names(url: str, cfg: LlamaConfig, wanted: set[str], stored: set[str]) -> None:
  """Every tensor the model needs is stored, and every stored tensor is used (none silently dropped)."""
  missing = sorted(wanted - stored)
  if missing:
    raise ValueError(f"checkpoint {url} lacks tensor(s) {missing[:5]}{' ...' if len(missing) > 5 else ''} that "
                     f"config.json (model_type={cfg.model_type}, tie_word_embeddings={cfg.tie_word_embeddings}, "
                     f"num_hidden_layers={cfg.num_hidden_layers}) requires")
  unused = sorted(n for n in stored - wanted if not n.endswith(_DERIVED_SUFFIXES))
  if unused:
    fix = ("config.json says tie_word_embeddings=true: set it false to use the stored head"
           if unused == ["lm_head.weight"] else "this checkpoint is not the family config.json names, or uses "
           "a feature jaxpod does not implement")
    raise ValueError(f"checkpoint {url} has tensor(s) {unused[:5]}{' ...' if len(unused) > 5 else ''} that a "
                     f"{cfg.model_type} model with this config.json does not use; {fix}")


@contextlib.contextmanager
def _local_folder(url: str, names: list[str]) -> Iterator[str]:
  """A local folder holding `names` from `url`: the folder itself if local, else a temporary copy."""
  fs, root = fsspec.core.url_to_fs(url)
  if "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)):
    yield root
    return
  with tempfile.TemporaryDirectory(prefix="jaxpod-hf-") as tmp:
    for n in names:
      fs.get(f"{root.rstrip('/')}/{n}", os.path.join(tmp, n))
    yield tmp


def _weight_map(url: str) -> dict[str, str]:
  """tensor name -> file name, from the index file or the single-file checkpoint."""
  fs, root = fsspec.core.url_to_fs(url)
  index = f"{root.rstrip('/')}/{INDEX_FILE}"
  if fs.exists(index):
    with fs.open(index, "r") as f:
      return dict(json.load(f)["weight_map"])
  single = f"{root.rstrip('/')}/{SINGLE_FILE}"
  if not fs.exists(single):
    raise FileNotFoundError(f"{url}: neither {SINGLE_FILE} nor {INDEX_FILE} found; point --model at a HF "
                            "checkpoint folder saved with safetensors")
  from safetensors import safe_open
  with _local_folder(url, [SINGLE_FILE]) as local, safe_open(os.path.join(local, SINGLE_FILE), "numpy") as f:
    return {k: SINGLE_FILE for k in f.keys()}


def _tied_copy(url: str, wmap: dict[str, str]) -> bool:
  """Whether the checkpoint's lm_head.weight equals its embedding (a tied head stored twice)."""
  from safetensors import safe_open
  names = ("lm_head.weight", "model.embed_tokens.weight")
  if names[1] not in wmap:
    return False
  files = sorted({wmap[n] for n in names})
  with _local_folder(url, files) as local, contextlib.ExitStack() as stack:
    handles = {f: stack.enter_context(safe_open(os.path.join(local, f), "numpy")) for f in files}
    head, embed = (handles[wmap[n]].get_tensor(n) for n in names)
    return head.shape == embed.shape and bool(np.array_equal(head, embed))


def load_config(url: str, **overrides) -> LlamaConfig:
  """LlamaConfig from `<url>/config.json` (overrides e.g. dtype='bfloat16')."""
  return LlamaConfig.from_json_file(f"{url.rstrip('/')}/config.json", **overrides)


def load(url: str, mesh, cfg: LlamaConfig | None = None, rules: ShardingRules = DEFAULT_RULES,
         **config_overrides) -> model_lib.Llama:
  """Load a HF checkpoint (any family in `families/`) into a jaxpod `Llama` whose parameters are sharded over `mesh`."""
  from safetensors import safe_open
  cfg = cfg or load_config(url, **config_overrides)
  graphdef, abs_state = nnx.split(model_lib.abstract(cfg))
  shardings = nnx.to_flat_state(state_shardings(abs_state, mesh, rules))
  flat = nnx.to_flat_state(abs_state)
  wmap = _weight_map(url)
  wanted = {hf_name(p) for p, _ in flat}
  stored = set(wmap)
  if cfg.tie_word_embeddings and "lm_head.weight" in stored and _tied_copy(url, wmap):
    stored.discard("lm_head.weight")  # some exports store the tied head too: a copy of the embedding is no loss
  _check_names(url, cfg, wanted, stored)
  files = sorted({wmap[n] for n in wanted})
  leaves = []
  with _local_folder(url, files) as local, contextlib.ExitStack() as stack:
    handles = {f: stack.enter_context(safe_open(os.path.join(local, f), "numpy")) for f in files}
    for (path, var), (_, sharding) in zip(flat, shardings):
      name, shape = hf_name(path), tuple(var.shape)
      w = handles[wmap[name]].get_tensor(name)
      if tuple(w.shape) != hf_shape(path, shape):
        raise ValueError(f"tensor {name} in {wmap[name]}: expected shape {hf_shape(path, shape)} from "
                         f"config.json, found {tuple(w.shape)}")
      w = from_hf(path, w, shape).astype(var.dtype)
      leaves.append(jax.make_array_from_callback(shape, sharding, lambda idx, w=w: np.ascontiguousarray(w[idx])))
  state = nnx.from_flat_state([(p, v.replace(a)) for (p, v), a in zip(flat, leaves)])
  return nnx.merge(graphdef, state)


def _to_numpy(x: jax.Array) -> np.ndarray:
  """Whole array on this host (a collective when x spans processes: every host must call it)."""
  if getattr(x, "is_fully_addressable", True):
    return np.asarray(jax.device_get(x))
  from jax.experimental import multihost_utils
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def _shard_files(tensors: dict[str, np.ndarray], max_shard_bytes: int | None) -> dict[str, list[str]]:
  """file name -> tensor names: one `model.safetensors`, or HF-named shards of at most max_shard_bytes each
  (a tensor larger than that gets a file of its own)."""
  if not max_shard_bytes:
    return {SINGLE_FILE: list(tensors)}
  groups: list[list[str]] = [[]]
  size = 0
  for name, w in tensors.items():
    if groups[-1] and size + w.nbytes > max_shard_bytes:
      groups.append([])
      size = 0
    groups[-1].append(name)
    size += w.nbytes
  n = len(groups)
  return {f"model-{i + 1:05d}-of-{n:05d}.safetensors": g for i, g in enumerate(groups)}


def save(model: model_lib.Llama, url: str, dtype: str | None = None, max_shard_bytes: int | None = None) -> None:
  """Write `config.json` + safetensors in HF layout (shards + index past max_shard_bytes); every host calls it,
  the leader writes."""
  from safetensors.numpy import save as st_save
  from jaxpod.models.llama import lora
  if lora.lora_config(model) is not None:  # LoRA adapters: export the merged W + s * A B (a plain HF checkpoint)
    model = lora.merged(model)
  cfg = model.cfg
  tensors = {}
  for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    w = _to_numpy(var.get_value())
    tensors[hf_name(path)] = to_hf(path, w.astype(dtype) if dtype else w)
  if jax.process_index() != 0:
    return
  fs, root = fsspec.core.url_to_fs(url)
  root = root.rstrip("/")
  fs.makedirs(root, exist_ok=True)
  hf_cfg = cfg.to_hf_config()
  if dtype:
    hf_cfg["dtype"] = dtype
  with fs.open(f"{root}/config.json", "w") as f:
    json.dump(hf_cfg, f, indent=2)
  files = _shard_files(tensors, max_shard_bytes)
  for fname, names in files.items():
    with fs.open(f"{root}/{fname}", "wb") as f:
      f.write(st_save({k: tensors[k] for k in names}, metadata={"format": "pt"}))
  if len(files) > 1:
    index = {"metadata": {"total_size": sum(w.nbytes for w in tensors.values())},
             "weight_map": {k: fname for fname, names in files.items() for k in names}}
    with fs.open(f"{root}/{INDEX_FILE}", "w") as f:
      json.dump(index, f, indent=2)
