"""Reference PyTorch TRM state dicts (safetensors) <-> jaxpod TRM, exactly (transposes/reshapes only).

The reference stores Linear weights [out, in]; jaxpod stores kernels [in, out] with the fused
output dims split (qkv [D, 3, H, E], gate/up [in, 2, F], o [H, E, D]). Checkpoints written by
the reference trainer carry a `model.` (loss head) and possibly `_orig_mod.` (torch.compile)
prefix; both are accepted on import. The reference creates H_init / L_init in its forward dtype,
so a bfloat16 run stores them as bf16: import upcasts (exact), export writes them in
`compute_dtype` (the value the forward pass uses); everything else is fp32.
"""
from __future__ import annotations

from typing import Callable

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxpod.models.trm.config import TRMConfig, swiglu_width
from jaxpod.models.trm.model import TRM

_PREFIXES = ("_orig_mod.", "model.")


def _linear(shape_in_out: tuple) -> tuple[Callable, Callable]:
  """(reference [out, in] -> ours, ours -> reference) for a kernel stored [in, *out_split]."""
  def to_ours(w):
    return np.ascontiguousarray(w.T).reshape(shape_in_out)

  def to_ref(k):
    return np.ascontiguousarray(k.reshape(shape_in_out[0], -1).T)
  return to_ours, to_ref


def _out_first(shape_out_in: tuple) -> tuple[Callable, Callable]:
  """For kernels stored [*in_split, out] (o_proj): reference [out, in] -> [*in_split, out]."""
  def to_ours(w):
    return np.ascontiguousarray(w.T).reshape(shape_out_in)

  def to_ref(k):
    return np.ascontiguousarray(k.reshape(-1, shape_out_in[-1]).T)
  return to_ours, to_ref


_IDENTITY = (lambda w: np.asarray(w), lambda k: np.asarray(k))


def key_map(cfg: TRMConfig) -> dict[str, tuple[tuple, tuple[Callable, Callable]]]:
  """reference key -> (our variable path, (to_ours, to_ref))."""
  d, v = cfg.hidden_size, cfg.vocab_size
  m: dict = {
      "inner.H_init": (("H_init",), _IDENTITY),
      "inner.L_init": (("L_init",), _IDENTITY),
      "inner.embed_tokens.embedding_weight": (("embed_tokens",), _IDENTITY),
      "inner.lm_head.weight": (("lm_head",), _linear((d, v))),
      "inner.q_head.weight": (("q_head",), _linear((d, 2))),
      "inner.q_head.bias": (("q_head_bias",), _IDENTITY),
  }
  if cfg.puzzle_emb_ndim > 0:
    m["inner.puzzle_emb.weights"] = (("puzzle_emb",), _IDENTITY)
  if cfg.pos_encodings == "learned":
    m["inner.embed_pos.embedding_weight"] = (("embed_pos",), _IDENTITY)
  f = swiglu_width(d, cfg.expansion)
  for i in range(cfg.l_layers):
    ref, ours = f"inner.L_level.layers.{i}", ("layers", i)
    m[f"{ref}.mlp.gate_up_proj.weight"] = (ours + ("mlp", "gate_up"), _linear((d, 2, f)))
    m[f"{ref}.mlp.down_proj.weight"] = (ours + ("mlp", "down"), _linear((f, d)))
    if cfg.mlp_t:
      t = cfg.total_seq_len
      ft = swiglu_width(t, cfg.expansion)
      m[f"{ref}.mlp_t.gate_up_proj.weight"] = (ours + ("mlp_t", "gate_up"), _linear((t, 2, ft)))
      m[f"{ref}.mlp_t.down_proj.weight"] = (ours + ("mlp_t", "down"), _linear((ft, t)))
    else:
      h, e = cfg.num_heads, cfg.head_dim
      m[f"{ref}.self_attn.qkv_proj.weight"] = (ours + ("self_attn", "qkv"), _linear((d, 3, h, e)))
      m[f"{ref}.self_attn.o_proj.weight"] = (ours + ("self_attn", "o"), _out_first((h, e, d)))
  return m


def _strip(key: str) -> str:
  changed = True
  while changed:
    changed = False
    for p in _PREFIXES:
      if key.startswith(p):
        key, changed = key[len(p):], True
  return key


def _variable(model: TRM, path: tuple):
  node = model
  for p in path:
    node = node[p] if isinstance(p, int) else getattr(node, p)
  return node


def load_state_dict_into(model: TRM, state_dict: dict) -> TRM:
  """Copy a reference state dict (numpy arrays) into `model` in place; every key must match."""
  mapping = key_map(model.cfg)
  sd = {_strip(k): np.asarray(v) for k, v in state_dict.items()}
  missing = sorted(set(mapping) - set(sd))
  unexpected = sorted(set(sd) - set(mapping))
  if missing or unexpected:
    raise ValueError(f"reference state dict does not match TRMConfig: missing {missing}, unexpected {unexpected}; "
                     "check mlp_t / pos_encodings / l_layers / puzzle_emb_ndim")
  for key, (path, (to_ours, _)) in mapping.items():
    var = _variable(model, path)
    value = to_ours(sd[key].astype(np.float32))
    if value.shape != tuple(var.shape):
      raise ValueError(f"{key}: reference shape {sd[key].shape} gives {value.shape}, the model expects "
                       f"{tuple(var.shape)}; check hidden_size/num_heads/expansion/seq_len")
    var.set_value(jnp.asarray(value))
  return model


def load_reference_state_dict(path: str, cfg: TRMConfig) -> TRM:
  """A TRM built from `cfg` holding the weights of a reference safetensors state dict at `path`.

  The model is created abstractly (no random init); every variable comes from the file.
  """
  from safetensors.flax import load_file  # numpy's loader cannot read bf16 tensors
  model = nnx.eval_shape(lambda: TRM(cfg, rngs=nnx.Rngs(0)))
  return load_state_dict_into(model, {k: np.asarray(v) for k, v in load_file(path).items()})


def export_reference_state_dict(model: TRM, path: str | None = None) -> dict[str, np.ndarray]:
  """The model's weights under the reference's key names and layouts; written as safetensors if `path`."""
  sd = {key: to_ref(np.asarray(_variable(model, p)[...], np.float32))
        for key, (p, (_, to_ref)) in key_map(model.cfg).items()}
  for key in ("inner.H_init", "inner.L_init"):
    sd[key] = sd[key].astype(jnp.dtype(model.cfg.compute_dtype))
  if path is not None:
    from safetensors.numpy import save_file
    save_file(sd, path)
  return sd
