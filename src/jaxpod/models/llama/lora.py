"""LoRA adapters on the decoder's linear layers, built on flax's `nnx.LoRA` (weights typed `nnx.LoRAParam`).

    lcfg = LoraConfig(rank=8, alpha=16)              # default targets: every attention and MLP linear layer
    model = lora.attach(hf_io.load(folder, mesh), lcfg, mesh=mesh)
    adapters = nnx.state(model, nnx.LoRAParam)       # exactly the adapters: what the optimizer sees
    grads = nnx.grad(loss_fn, argnums=nnx.DiffState(0, nnx.LoRAParam))(model, batch)  # no base gradient
    plain = lora.merged(model)                       # W + s * A B in the base, adapters gone (HF export)
    graphdef, adapters, base = nnx.split(model, nnx.LoRAParam, ...)
    ref = forward(lora.base_graphdef(cfg), base, tokens)  # the same weights with the adapters off (DPO's reference)

A target projection `W` (jaxpod layout [in..., out...]) gains `<name>_lora`, an `Adapter` holding
`nnx.LoRA(in, r, out)`: A [in, r] and B [r, out] over the flattened in/out dims, so the layer computes
`x W + s * (x A) B` (`model.adapted`), with `s = alpha / r`, or `alpha / sqrt(r)` with rsLoRA. B starts
at zero (the adapted model equals the base at init); A is drawn like PEFT's (Kaiming-uniform, a=sqrt(5):
U(+-1/sqrt(in))). Adapters are float32 whatever the model's dtype (they compute in the model's dtype),
and carry logical axes: A's input dim is sharded like the base's input dim, B's output dim like its
output dim, the rank replicated. The base stays where it is: attaching allocates only the adapters. Like the
blocks' weights, every adapter is stacked over the layers (A [L, in, r], B [L, r, out]; `stack.py`), drawn layer
by layer in the order of a model with a block per layer.

Why `nnx.LoRA` rather than qwix's LoRA provider: jaxpod's projections are raw einsums on `nnx.Param`
arrays (not `nnx.Linear`), so qwix would have to intercept those einsums by module path and name its
adapters after the intercepted call; `nnx.LoRA` is the flax layer itself, explicit in the module tree
(PEFT's names map one to one onto paths) and needs no new dependency.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxpod.models.llama import model as model_lib, stack
from jaxpod.models.llama.config import LlamaConfig

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
TARGETS = ATTENTION + MLP


@dataclasses.dataclass(frozen=True)
class LoraConfig:
  """Low-rank adapters on the decoder's linear layers (PEFT's LoRA; the base stays frozen)."""

  rank: int = 8  # r: inner width of every adapter (PEFT `r`)
  alpha: float = 16.0  # scale numerator: s = alpha / r, or alpha / sqrt(r) with rslora (PEFT `lora_alpha`)
  rslora: bool = False  # rank-stabilised scale alpha / sqrt(r) (PEFT `use_rslora`)
  target_modules: tuple[str, ...] = TARGETS  # projections that get an adapter (HF names); default all linear

  def __post_init__(self):
    if not isinstance(self.rank, int) or self.rank < 1:
      raise ValueError(f"LoraConfig.rank={self.rank!r} must be an integer >= 1")
    if not self.alpha > 0:
      raise ValueError(f"LoraConfig.alpha={self.alpha!r} must be > 0")
    raw = self.target_modules  # a string (a YAML scalar, or "q_proj,v_proj" from the command line) is a name list
    targets = tuple(t.strip() for t in raw.split(",") if t.strip()) if isinstance(raw, str) else tuple(raw)
    object.__setattr__(self, "target_modules", targets)
    bad = [t for t in targets if t not in TARGETS]
    if bad or not targets:
      raise ValueError(f"LoraConfig.target_modules={list(targets)}: {bad or 'none'} unknown; use some of {TARGETS}")

  @property
  def scale(self) -> float:
    """s: the adapter output's multiplier."""
    return self.alpha / (math.sqrt(self.rank) if self.rslora else self.rank)


def shapes(cfg: LlamaConfig) -> dict[str, tuple[int, int, str, str]]:
  """HF projection name -> (in, out, in logical axis, out logical axis) of its flattened linear map."""
  d, i, e = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim_
  h, k = cfg.num_attention_heads * e, cfg.num_key_value_heads * e
  return {"q_proj": (d, h, "embed", "heads"), "k_proj": (d, k, "embed", "kv_heads"),
          "v_proj": (d, k, "embed", "kv_heads"), "o_proj": (h, d, "heads", "embed"),
          "gate_proj": (d, i, "embed", "mlp"), "up_proj": (d, i, "embed", "mlp"), "down_proj": (i, d, "mlp", "embed")}


def owner(name: str) -> str:
  """The block attribute holding projection `name`: self_attn or mlp."""
  return "self_attn" if name in ATTENTION else "mlp"


class Adapter(nnx.Module):
  """s * (x A) B for one projection: flax's `nnx.LoRA` (A [in, r], B [r, out], both `nnx.LoRAParam`) times s."""

  def __init__(self, n_in: int, n_out: int, axes: tuple[str, str], lcfg: LoraConfig, dtype, *, rngs: nnx.Rngs,
               a_init=None):
    self.scale = lcfg.scale
    self.lora = nnx.LoRA(n_in, lcfg.rank, n_out, dtype=dtype, param_dtype=jnp.float32, rngs=rngs,
                         a_initializer=a_init or jax.nn.initializers.variance_scaling(1 / 3, "fan_in", "uniform"),
                         a_metadata={"logical_axes": (axes[0], None)},
                         b_metadata={"logical_axes": (None, axes[1])})

  def __call__(self, x_BxTxF):
    """s * (x A) B on the flattened rows (as `model.dense`, so XLA:CPU copies no gradient transposed): [B, T, out]."""
    y_NxO = self.lora(x_BxTxF.reshape(-1, x_BxTxF.shape[-1]))
    return y_NxO.reshape(*x_BxTxF.shape[:-1], -1) * jnp.asarray(self.scale, x_BxTxF.dtype)


def _build(model: model_lib.Llama, lcfg: LoraConfig, seed: int, traced: bool) -> None:
  """Attach fresh adapters to every block of `model` (in place). A is U(+-1/sqrt(in)): drawn with numpy
  eagerly (no compile per shape), with jax.random when traced (numpy would bake constants into the program)."""
  cfg, rngs, rng = model.cfg, nnx.Rngs(params=seed), np.random.default_rng(seed)

  def a_init(_, shape, dtype):
    return jnp.asarray(rng.uniform(-1, 1, shape) / math.sqrt(shape[0]), dtype)
  table = shapes(cfg)

  def adapter(name):
    n_in, n_out, a_in, a_out = table[name]
    return Adapter(n_in, n_out, (a_in, a_out), lcfg, cfg.jnp_dtype, rngs=rngs, a_init=None if traced else a_init)
  made = [{name: adapter(name) for name in lcfg.target_modules} for _ in range(cfg.num_hidden_layers)]
  for name in lcfg.target_modules:  # drawn layer by layer, stored stacked like the blocks' weights
    setattr(getattr(model.layers, owner(name)), f"{name}_lora", stack.stack_modules([m[name] for m in made]))


def attach(model: model_lib.Llama, lcfg: LoraConfig, seed: int = 0, mesh=None, rules=None,
           traced: bool = False) -> model_lib.Llama:
  """Add LoRA adapters (B = 0: the output is unchanged) to `model` in place and return it; with `mesh`,
  the adapters are placed in their shardings (the base is not touched). traced: called inside a jit or
  eval_shape (a train state's init)."""
  if lora_config(model) is not None:
    raise ValueError("this model already has LoRA adapters; attach once (or start from lora.merged(model))")
  _build(model, lcfg, seed, traced)
  model.lora_config = lcfg
  if mesh is not None:
    from jaxpod.runtime.sharding import DEFAULT, state_shardings
    adapters = nnx.state(model, nnx.LoRAParam)
    flat, shardings = nnx.to_flat_state(adapters), jax.tree.leaves(state_shardings(adapters, mesh, rules or DEFAULT))
    nnx.update(model, nnx.from_flat_state([(p, v.replace(_place(np.asarray(v.get_value()), sh)))
                                           for (p, v), sh in zip(flat, shardings)]))
  return model


def _place(w: np.ndarray, sharding) -> jax.Array:
  """The same host array on every host -> a global array in `sharding` (each host fills only its own shards)."""
  return jax.make_array_from_callback(w.shape, sharding, lambda idx: np.ascontiguousarray(w[idx]))


def is_b(params):
  """The pytree of `params` with True at every adapter's B (`lora_b`): optax.masked's mask for B-only updates."""
  return jax.tree_util.tree_map_with_path(lambda path, _: "lora_b" in jax.tree_util.keystr(path), params)


def scale_b(tx, ratio: float):
  """`tx` with every adapter B's updates x `ratio` after it (LoRA+: B's lr / A's lr); `tx` itself at ratio 1."""
  import optax
  return tx if ratio == 1.0 else optax.chain(tx, optax.masked(optax.scale(ratio), is_b))


def lora_config(model: model_lib.Llama) -> LoraConfig | None:
  """The LoraConfig the model's adapters were attached with (None: no adapters)."""
  return getattr(model, "lora_config", None)


def adapters(model: model_lib.Llama) -> dict[tuple[int, str], tuple[jax.Array, jax.Array]]:
  """(layer, projection) -> (A [in, r], B [r, out]) of every adapter of `model`."""
  lcfg = lora_config(model)
  if lcfg is None:
    return {}
  out = {}
  for name in lcfg.target_modules:
    lora = _stacked_lora(model, name)
    a, b = lora.lora_a[...], lora.lora_b[...]
    out.update({(i, name): (a[i], b[i]) for i in range(model.cfg.num_hidden_layers)})
  return out


def _stacked_lora(model: model_lib.Llama, name: str) -> nnx.LoRA:
  """The `nnx.LoRA` of projection `name`, its A [L, in, r] and B [L, r, out] stacked over the layers."""
  return getattr(getattr(model.layers, owner(name)), f"{name}_lora").lora


def set_adapters(model: model_lib.Llama, values: Mapping[tuple[int, str], tuple]) -> None:
  """Overwrite adapters in place from (layer, projection) -> (A [in, r], B [r, out]) host arrays (the same on
  every host, every layer of each projection named), keeping each one's dtype and sharding."""
  n = model.cfg.num_hidden_layers
  for name in sorted({name for _, name in values}):
    missing = [i for i in range(n) if (i, name) not in values]
    if missing:
      raise ValueError(f"set_adapters: {name} has no value for layer(s) {missing}; give every layer's (A, B)")
    lora = _stacked_lora(model, name)
    for var, which in ((lora.lora_a, 0), (lora.lora_b, 1)):
      old = var[...]
      w = np.stack([np.asarray(values[(i, name)][which], old.dtype) for i in range(n)])
      var.set_value(_place(w, old.sharding))


def _folded(w: jax.Array, a: jax.Array, b: jax.Array, scale: float) -> jax.Array:
  """W + s * A B in W's dtype (computed in float32): one projection with its adapter merged (stacked: W [L, ...],
  A [L, in, r], B [L, r, out])."""
  delta = jnp.matmul(a.astype(jnp.float32), b.astype(jnp.float32)) * scale
  return (w.astype(jnp.float32) + delta.reshape(w.shape)).astype(w.dtype)


def merged(model: model_lib.Llama) -> model_lib.Llama:
  """A plain model (no adapters; `model` untouched) whose projections are W + s * A B: what `hf_io.save` exports
  as a HF checkpoint."""
  lcfg = lora_config(model)
  deltas = {(owner(name), name): (lambda lora: (lora.lora_a[...], lora.lora_b[...]))(_stacked_lora(model, name))
            for name in (lcfg.target_modules if lcfg else ())}

  def value(path, w):
    if len(path) != 3 or (path[1], path[2]) not in deltas:
      return w
    return _folded(w, *deltas[(path[1], path[2])], lcfg.scale)
  flat = nnx.to_flat_state(nnx.state(model, nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam))))
  graphdef, _ = nnx.split(model_lib.abstract(model.cfg))
  return nnx.merge(graphdef, nnx.from_flat_state([(p, v.replace(value(p, v.get_value()))) for p, v in flat]))


def merge_in_place(model: model_lib.Llama) -> model_lib.Llama:
  """Fold the adapters into the base (W <- W + s * A B, each keeping its sharding) and remove them: the plain
  model `merged` gives, with the same values, but one projection at a time, so the peak is the model plus one
  weight rather than two copies. For a one-pass reader of the adapted model (extraction)."""
  lcfg = lora_config(model)
  if lcfg is None:
    return model
  for name in lcfg.target_modules:
    module = getattr(model.layers, owner(name))
    adapter, var = getattr(module, f"{name}_lora").lora, getattr(module, name)
    w = var[...]
    var.set_value(jax.device_put(_folded(w, adapter.lora_a[...], adapter.lora_b[...], lcfg.scale), w.sharding))
    delattr(module, f"{name}_lora")
  del model.lora_config
  return model


def base_graphdef(cfg: LlamaConfig):
  """The plain model's graphdef: merged with the frozen base state of a LoRA model (`nnx.split(model,
  nnx.LoRAParam, ...)[2]`) it runs that model with its adapters off, from the same arrays (no copy)."""
  return nnx.split(model_lib.abstract(cfg))[0]
