"""Hugging Face Llama checkpoints <-> jaxpod `Llama`, straight into a target sharding.

`load(path, mesh)` reads `config.json` and `model.safetensors` (or the shards listed in
`model.safetensors.index.json`) from a local folder or any fsspec URL, and places every
tensor directly into the sharding that `runtime.state_shardings` gives it: each host reads
a tensor once and keeps only the shards its devices own. Missing or mis-shaped tensors
raise naming the tensor, the expected shape (from config.json) and the one found.

`save(model, path)` writes the HF layout back (config.json + model.safetensors); every host
takes part in gathering sharded arrays, the leader alone writes.

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


def hf_name(path: tuple) -> str:
  """jaxpod state path -> HF tensor name, e.g. ('layers', 0, 'mlp', 'up_proj') -> model.layers.0.mlp.up_proj.weight."""
  if path == ("lm_head",):
    return "lm_head.weight"
  return "model." + ".".join(str(p) for p in path) + ".weight"


def hf_shape(path: tuple, shape: tuple[int, ...]) -> tuple[int, ...]:
  """Shape of the HF tensor that holds a jaxpod parameter of `shape`."""
  n_in = _LINEAR_IN_DIMS.get(path[-1])
  if n_in is None:
    return tuple(shape)
  return (math.prod(shape[n_in:]), math.prod(shape[:n_in]))


def from_hf(path: tuple, w: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
  """HF tensor -> jaxpod layout (a view where possible)."""
  return w if path[-1] not in _LINEAR_IN_DIMS else w.T.reshape(shape)


def to_hf(path: tuple, w: np.ndarray) -> np.ndarray:
  """jaxpod parameter -> HF tensor layout."""
  n_in = _LINEAR_IN_DIMS.get(path[-1])
  if n_in is None:
    return w
  return np.ascontiguousarray(w.reshape(math.prod(w.shape[:n_in]), -1).T)


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


def load_config(url: str, **overrides) -> LlamaConfig:
  """LlamaConfig from `<url>/config.json` (overrides e.g. dtype='bfloat16')."""
  return LlamaConfig.from_json_file(f"{url.rstrip('/')}/config.json", **overrides)


def load(url: str, mesh, cfg: LlamaConfig | None = None, rules: ShardingRules = DEFAULT_RULES,
         **config_overrides) -> model_lib.Llama:
  """Load a HF Llama checkpoint into a jaxpod `Llama` whose parameters are sharded over `mesh`."""
  from safetensors import safe_open
  cfg = cfg or load_config(url, **config_overrides)
  graphdef, abs_state = nnx.split(model_lib.abstract(cfg))
  shardings = nnx.to_flat_state(state_shardings(abs_state, mesh, rules))
  flat = nnx.to_flat_state(abs_state)
  wmap = _weight_map(url)
  wanted = {hf_name(p) for p, _ in flat}
  missing = sorted(wanted - set(wmap))
  if missing:
    raise ValueError(f"checkpoint {url} lacks tensor(s) {missing[:5]}{' ...' if len(missing) > 5 else ''} that "
                     f"config.json (tie_word_embeddings={cfg.tie_word_embeddings}, "
                     f"num_hidden_layers={cfg.num_hidden_layers}) requires")
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


def save(model: model_lib.Llama, url: str, dtype: str | None = None) -> None:
  """Write `config.json` + `model.safetensors` in HF layout; every host calls it, the leader writes."""
  from safetensors.numpy import save as st_save
  cfg = model.cfg
  tensors = {}
  for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    w = _to_numpy(var.get_value())
    tensors[hf_name(path)] = to_hf(path, w.astype(dtype) if dtype else w)
  if jax.process_index() != 0:
    return
  fs, root = fsspec.core.url_to_fs(url)
  fs.makedirs(root, exist_ok=True)
  hf_cfg = cfg.to_hf_config()
  if dtype:
    hf_cfg["dtype"] = dtype
  with fs.open(f"{root.rstrip('/')}/config.json", "w") as f:
    json.dump(hf_cfg, f, indent=2)
  with fs.open(f"{root.rstrip('/')}/{SINGLE_FILE}", "wb") as f:
    f.write(st_save(tensors, metadata={"format": "pt"}))
