"""Hugging Face checkpoints of every family in `families/` <-> jaxpod `Llama`, straight into a target sharding.

`load(path, mesh)` reads `config.json` and `model.safetensors` (or the shards listed in
`model.safetensors.index.json`) from a local folder or any fsspec URL by byte range, and places every
tensor directly into the sharding that `runtime.state_shardings` gives it: each host reads only the
rows its devices hold (HF rows are contiguous); a tensor whose target splits HF columns is read as a
1/devices block of rows per device and moved into place by one jitted call. No file is copied whole,
not even to list a single file's keys (two ranged reads give its header). Missing or mis-shaped tensors
raise naming the tensor, the expected shape (from config.json) and the one found; so does a checkpoint
tensor the model would not use (a family feature jaxpod lacks must not be dropped silently).

`save(model, path)` writes the HF layout back: config.json + shards of at most `max_shard_bytes`
(default 5 GB, HF's) + `model.safetensors.index.json`, or one `model.safetensors` when it all fits.
Every host calls it; files go to hosts by bytes, each host streams its files (header first, computed
from shapes) and receives each of their tensors whole, one at a time (`io/owner_gather.py`), so no
host holds the model. The hosts then wait for the slowest upload with a deadline that scales with bytes.

Layout: HF linear weights are [out, in]; jaxpod keeps [in..., out...] so einsums read
naturally (q_proj [D, H, E], o_proj [H, E, D], gate_proj [D, I], lm_head [D, V]). A block weight is stacked
[L, ...] over the layers (`stack.py`): HF's `model.layers.{i}.<name>` is its slice i, loaded one layer at a time
(each placed like the stack's slice, then stacked on device) and exported one layer per tensor.
"""
from __future__ import annotations

import functools
import json
import math

import fsspec
import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from jaxpod.io import owner_gather, safetensors_io
from jaxpod.models.llama import model as model_lib
from jaxpod.models.llama.config import LlamaConfig
from jaxpod.models.llama.stack import is_stacked_path
from jaxpod.runtime import control
from jaxpod.runtime.sharding import DEFAULT as DEFAULT_RULES, ShardingRules, state_shardings

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
DEFAULT_SHARD_BYTES = 5 * 10 ** 9  # HF's save_pretrained default ("5GB")
UPLOAD_FLOOR_BPS = 10 * 10 ** 6  # slowest upload rate a save waits for before naming the slow host
# Leading "in" dims of each linear weight in jaxpod layout; absent names are copied as is.
_LINEAR_IN_DIMS = {"q_proj": 1, "k_proj": 1, "v_proj": 1, "o_proj": 2,
                   "gate_proj": 1, "up_proj": 1, "down_proj": 1, "lm_head": 1}
# Biases [heads, E] in jaxpod are flat [heads*E] `<proj>.bias` tensors in HF.
_BIAS_OF = {"q_bias": "q_proj", "k_bias": "k_proj", "v_bias": "v_proj"}
# Buffers older checkpoints stored that the config determines: read past, never used.
_DERIVED_SUFFIXES = ("rotary_emb.inv_freq",)


def hf_name(path: tuple, layer: int | None = None) -> str:
  """jaxpod state path (and layer of a stacked block weight) -> HF tensor name, e.g. ('layers', 'mlp', 'up_proj')
  at layer 0 -> model.layers.0.mlp.up_proj.weight."""
  if layer is not None:
    path = (path[0], layer, *path[1:])
  if path == ("lm_head",):
    return "lm_head.weight"
  if path[-1] in _BIAS_OF:
    return "model." + ".".join(str(p) for p in path[:-1]) + f".{_BIAS_OF[path[-1]]}.bias"
  return "model." + ".".join(str(p) for p in path) + ".weight"


def per_layer(path: tuple, shape: tuple[int, ...]) -> list[tuple[str, int | None, tuple[int, ...]]]:
  """(HF name, layer or None, jaxpod shape of that tensor) of every HF tensor a state leaf holds."""
  if is_stacked_path(path):
    return [(hf_name(path, i), i, tuple(shape[1:])) for i in range(shape[0])]
  return [(hf_name(path), None, tuple(shape))]


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


def _root(url: str) -> tuple:
  """(fsspec filesystem, folder path without a trailing slash)."""
  fs, root = fsspec.core.url_to_fs(url)
  return fs, root.rstrip("/")


def _headers(url: str) -> dict[str, tuple[str, safetensors_io.TensorInfo]]:
  """tensor name -> (file path, where it lies): the index file (if any) and each file's header, by ranged
  reads; no file is downloaded whole."""
  fs, root = _root(url)
  index = f"{root}/{INDEX_FILE}"
  if fs.exists(index):
    raw = safetensors_io.cat(fs, index, 0, fs.size(index))
    files = sorted(set(json.loads(raw)["weight_map"].values()))
  elif fs.exists(f"{root}/{SINGLE_FILE}"):
    files = [SINGLE_FILE]
  else:
    raise FileNotFoundError(f"{url}: neither {SINGLE_FILE} nor {INDEX_FILE} found; point --model at a HF "
                            "checkpoint folder saved with safetensors")
  out = {}
  for f in files:
    out.update({k: (f"{root}/{f}", info) for k, info in safetensors_io.read_header(fs, f"{root}/{f}").items()})
  return out


def _tied_copy(url: str, where: dict, mesh) -> bool:
  """Whether the checkpoint's lm_head.weight equals its embedding (a tied head stored twice): when the mesh spans
  every host, each compares its 1/hosts of the rows and the answers are gathered over the control plane."""
  names = ("lm_head.weight", "model.embed_tokens.weight")
  if names[1] not in where:
    return False
  (ph, head), (pe, emb) = where[names[0]], where[names[1]]
  if head.shape != emb.shape or head.dtype != emb.dtype:
    return False
  spread = len({d.process_index for d in mesh.devices.flat}) == jax.process_count() > 1
  rows = head.shape[0]
  hosts, me = (jax.process_count(), jax.process_index()) if spread else (1, 0)
  r = (me * rows // hosts, (me + 1) * rows // hosts)
  fs, _ = _root(url)
  same = bool(np.array_equal(safetensors_io.read_rows(fs, ph, head, [r])[0],
                             safetensors_io.read_rows(fs, pe, emb, [r])[0]))
  return all(control.allgather(same, "hf_io.load.tied_copy")) if spread else same


def _index_shape(index: tuple, shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
  """(start, stop) per dimension of a device's slice."""
  return tuple(s.indices(n)[:2] for s, n in zip(index, shape))


def _flat_range(spans, dims) -> tuple[int, int] | None:
  """[start, stop) of the row-major flattening of a box, if contiguous: every dim after the last partial one
  whole, every dim before it a single index."""
  partial = [i for i, ((a, b), n) in enumerate(zip(spans, dims)) if (a, b) != (0, n)]
  if not partial:
    return 0, math.prod(dims)
  j = partial[-1]
  if any(b - a != 1 for a, b in spans[:j]):
    return None
  start = sum(a * math.prod(dims[i + 1:]) for i, (a, _) in enumerate(spans))
  return start, start + (spans[j][1] - spans[j][0]) * math.prod(dims[j + 1:])


def hf_rows(path: tuple, shape: tuple[int, ...], index: tuple) -> tuple[int, int] | None:
  """The HF rows [r0, r1) that hold exactly the jaxpod slice `index` of a parameter of `shape` (with every HF
  column), or None when the slice splits HF columns or is not one row range."""
  spans = _index_shape(index, shape)
  if path[-1] in _BIAS_OF:
    return _flat_range(spans, shape)
  n_in = _LINEAR_IN_DIMS.get(path[-1])
  whole, rows, dims = (spans[:n_in], spans[n_in:], shape[n_in:]) if n_in is not None else (spans[1:], spans[:1],
                                                                                              shape[:1])
  inner = shape[:n_in] if n_in is not None else shape[1:]
  if any((a, b) != (0, n) for (a, b), n in zip(whole, inner)):
    return None
  return _flat_range(rows, dims)


def _place_rows(fs, fpath, info, path, shape, sharding, dtype) -> jax.Array:
  """Every device's rows read directly (its slice splits no HF column): one range per distinct slice."""
  local = sharding.addressable_devices_indices_map(shape)
  ranges = {d: hf_rows(path, shape, idx) for d, idx in local.items()}
  wanted = sorted(set(ranges.values()))
  blocks = dict(zip(wanted, (b.astype(dtype, copy=False) for b in safetensors_io.read_rows(fs, fpath, info, wanted))))

  def one(idx):
    local_shape = tuple(b - a for a, b in _index_shape(idx, shape))
    return np.ascontiguousarray(from_hf(path, blocks[hf_rows(path, shape, idx)], local_shape))

  return jax.make_array_from_callback(shape, sharding, one)


def _place_resharded(fs, fpath, info, path, shape, sharding, dtype) -> jax.Array:
  """The slices split HF columns: each device reads a contiguous block of HF rows, 1/(devices the target shards
  over) of them (padded with zeros to a multiple), then one jitted call moves them into `sharding` on device."""
  mesh = sharding.mesh
  axes = _used_axes(sharding.spec)
  rows, n = info.shape[0], math.prod(mesh.shape[a] for a in axes)
  padded = (-(-rows // n) * n, *info.shape[1:])
  by_rows = NamedSharding(mesh, PartitionSpec(axes))
  local = by_rows.addressable_devices_indices_map(padded)
  spans = {d: (min(a, rows), min(b, rows)) for d, idx in local.items() for a, b in [idx[0].indices(padded[0])[:2]]}
  wanted = sorted(set(spans.values()))
  blocks = dict(zip(wanted, (b.astype(dtype, copy=False) for b in safetensors_io.read_rows(fs, fpath, info, wanted))))

  def one(idx):
    a, b = idx[0].indices(padded[0])[:2]
    got = blocks[(min(a, rows), min(b, rows))]
    return np.concatenate([got, np.zeros((b - a - got.shape[0], *padded[1:]), dtype)]) if got.shape[0] < b - a \
        else got

  staged = jax.make_array_from_callback(padded, by_rows, one)
  out = _reshard_fn(path[-1], shape, rows, sharding)(staged)
  staged.delete()
  return out


def _used_axes(spec) -> tuple[str, ...]:
  """Mesh axes a PartitionSpec shards over, in its order (the rows are staged over these only, replicated like
  the target over the others: staging over an axis the target replicates makes XLA gather the whole tensor)."""
  out = []
  for entry in spec:
    out += [entry] if isinstance(entry, str) else list(entry or ())
  return tuple(out)


_RESHARD: dict = {}


def _reshard_fn(leaf: str, shape: tuple[int, ...], rows: int, sharding):
  """jit: HF rows (padded) -> jaxpod layout in `sharding` (the transpose moves bytes between devices)."""
  key = (leaf, shape, rows, sharding)
  if key not in _RESHARD:
    _RESHARD[key] = jax.jit(lambda w: from_hf((leaf,), w[:rows], shape), out_shardings=sharding)
  return _RESHARD[key]


def load_config(url: str, **overrides) -> LlamaConfig:
  """LlamaConfig from `<url>/config.json` (overrides e.g. dtype='bfloat16')."""
  return LlamaConfig.from_json_file(f"{url.rstrip('/')}/config.json", **overrides)


def load(url: str, mesh, cfg: LlamaConfig | None = None, rules: ShardingRules = DEFAULT_RULES,
         **config_overrides) -> model_lib.Llama:
  """Load a HF checkpoint (any family in `families/`) into a jaxpod `Llama` whose parameters are sharded over `mesh`;
  each host reads by byte range only the rows its devices hold (or 1/hosts of a tensor split along HF columns)."""
  cfg = cfg or load_config(url, **config_overrides)
  graphdef, abs_state = nnx.split(model_lib.abstract(cfg))
  shardings = nnx.to_flat_state(state_shardings(abs_state, mesh, rules))
  flat = nnx.to_flat_state(abs_state)
  where = _headers(url)
  wanted = {name for p, v in flat for name, _, _ in per_layer(p, tuple(v.shape))}
  stored = set(where)
  if cfg.tie_word_embeddings and "lm_head.weight" in stored and _tied_copy(url, where, mesh):
    stored.discard("lm_head.weight")  # some exports store the tied head too: a copy of the embedding is no loss
  _check_names(url, cfg, wanted, stored)
  fs, _ = _root(url)
  leaves = []
  for (path, var), (_, sharding) in zip(flat, shardings):
    dtype, pieces = np.dtype(var.dtype), []
    one = NamedSharding(mesh, PartitionSpec(*sharding.spec[1:])) if is_stacked_path(path) else sharding
    for name, _, shape in per_layer(path, tuple(var.shape)):
      fpath, info = where[name]
      if info.shape != hf_shape(path, shape):
        raise ValueError(f"tensor {name} in {fpath.rsplit('/', 1)[-1]}: expected shape {hf_shape(path, shape)} "
                         f"from config.json, found {info.shape}")
      direct = all(hf_rows(path, shape, idx) is not None for idx in one.devices_indices_map(shape).values())
      pieces.append((_place_rows if direct else _place_resharded)(fs, fpath, info, path, shape, one, dtype))
    leaves.append(_stacked(pieces, sharding) if is_stacked_path(path) else pieces[0])
  state = nnx.from_flat_state([(p, v.replace(a)) for (p, v), a in zip(flat, leaves)])
  return nnx.merge(graphdef, state)


def _stacked(layers: list, sharding) -> jax.Array:
  """One layer's arrays (each placed as a slice of `sharding`) stacked into `sharding` on device, then freed."""
  key = ("stack", len(layers), layers[0].shape, str(layers[0].dtype), sharding)
  if key not in _RESHARD:
    _RESHARD[key] = jax.jit(lambda *xs: jax.numpy.stack(xs), out_shardings=sharding)
  out = _RESHARD[key](*layers)
  for x in layers:
    x.delete()
  return out


def _hf_layout(leaf: str, dtype, layer: int | None, w):
  """jaxpod parameter (its slice `layer` of a stacked one) -> HF tensor layout in `dtype` (jittable; `to_hf` for
  arrays on device)."""
  if layer is not None:
    w = w[layer]
  if leaf in _BIAS_OF:
    w = w.reshape(-1)
  elif leaf in _LINEAR_IN_DIMS:
    w = w.reshape(math.prod(w.shape[:_LINEAR_IN_DIMS[leaf]]), -1).T
  return w.astype(dtype)


def save(model: model_lib.Llama, url: str, dtype: str | None = None,
         max_shard_bytes: int | None = DEFAULT_SHARD_BYTES) -> None:
  """Write `config.json` + safetensors in HF layout: shards of at most max_shard_bytes + an index (one
  `model.safetensors` when it all fits); every host calls it and writes the files assigned to it, receiving
  each of their tensors whole, one at a time; no host ever holds the model."""
  from jaxpod.models.llama import lora
  if lora.lora_config(model) is not None:  # LoRA adapters: export the merged W + s * A B (a plain HF checkpoint)
    model = lora.merged(model)
  leaves = [(p, v.get_value()) for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))]
  tensors = [(n, p, layer, x) for p, x in leaves for n, layer, _ in per_layer(p, tuple(x.shape))]
  save_dtype = dtype or model.cfg.dtype  # float32 master weights export in the model's dtype (config.json's)
  out_dtype = {n: np.dtype(jax.numpy.dtype(save_dtype)) for n, _, _, _ in tensors}
  shapes = {n: hf_shape(p, tuple(x.shape[1:] if layer is not None else x.shape)) for n, p, layer, x in tensors}
  sizes = [(n, math.prod(shapes[n]) * out_dtype[n].itemsize) for n, _, _, _ in tensors]
  params = [(p, x) for p, x in leaves]
  files = safetensors_io.group_files(sizes, max_shard_bytes, SINGLE_FILE)
  nbytes = dict(sizes)
  spread = not all(getattr(x, "is_fully_addressable", True) for _, x in params)
  if not spread and jax.process_index() != 0:
    return  # each host holds the whole model (single-host arrays): the leader writes it
  mesh = next(x.sharding.mesh for _, x in params if not x.is_fully_addressable) if spread else None
  hosts = owner_gather.hosts_of(mesh) if spread else [0]
  owners = {f: hosts[h] for f, h in safetensors_io.assign_files(
      {f: sum(nbytes[n] for n in names) for f, names in files.items()}, len(hosts)).items()}
  fs, root = _root(url)
  leader = jax.process_index() == hosts[0]
  if leader:
    fs.makedirs(root, exist_ok=True)
    hf_cfg = model.cfg.to_hf_config()
    if dtype:
      hf_cfg["dtype"] = dtype
    _write_small(fs, f"{root}/config.json", json.dumps(hf_cfg, indent=2))
  if spread:
    control.barrier("hf_io.save.folder")  # the folder exists before any host opens a file in it
  jobs, file_of = [], []
  arrays = {n: (p, layer, x) for n, p, layer, x in tensors}
  for fname in sorted(files):
    for n in files[fname]:
      p, layer, x = arrays[n]
      jobs.append(owner_gather.Job(x, owners[fname], functools.partial(_hf_layout, p[-1], out_dtype[n], layer),
                                   ("hf_layout", p[-1], str(out_dtype[n]), layer)))
      file_of.append(fname)
  if jax.process_index() in hosts:
    _write_files(fs, root, jobs, file_of, files, shapes, out_dtype, mesh)
  if spread:  # uploads run past the last collective: wait as long as the largest share takes at a slow rate
    most = max(sum(nbytes[n] for f, names in files.items() if owners[f] == h for n in names) for h in hosts)
    control.barrier("hf_io.save.files", timeout_s=control.bytes_timeout_s(None, most, UPLOAD_FLOOR_BPS))
  if len(files) > 1 and leader:  # the index last: a reader that finds it finds every file
    index = {"metadata": {"total_size": sum(nbytes.values())},
             "weight_map": {n: f for f, names in files.items() for n in names}}
    _write_small(fs, f"{root}/{INDEX_FILE}", json.dumps(index, indent=2))


def _write_small(fs, path: str, text: str) -> None:
  with fs.open(path, "w") as f:
    f.write(text)
  safetensors_io.count("written", len(text.encode()))


def _write_files(fs, root, jobs, file_of, files, shapes, out_dtype, mesh) -> None:
  """Stream this host's files: each one's header (known from shapes), then each tensor's bytes as it arrives."""
  f, current = None, None
  pieces_of = owner_gather.deliver(jobs, mesh) if mesh is not None else _local(jobs)
  try:
    for i, pieces in pieces_of:
      if file_of[i] != current:
        if f is not None:
          f.close()
        current = file_of[i]
        f = fs.open(f"{root}/{current}", "wb")
        head = safetensors_io.header_bytes([(n, safetensors_io.dtype_name(out_dtype[n]), shapes[n])
                                            for n in files[current]], metadata={"format": "pt"})
        f.write(head)
        safetensors_io.count("written", len(head))
      for piece in pieces:
        f.write(memoryview(piece))
        safetensors_io.count("written", piece.nbytes)
  finally:
    if f is not None:
      f.close()


def _local(jobs):
  """deliver() for arrays whole on this host (single process, or each host its own copy): no collectives."""
  for i, job in enumerate(jobs):
    y = np.ascontiguousarray(jax.device_get(job.convert(job.array)))
    safetensors_io.count("gathered", y.nbytes)
    yield i, [y.reshape(-1).view(np.uint8)]
