"""Attention kernels (`models/llama/kernels.py`): which one runs where, and splash's parity with the XLA path.

Splash runs in Pallas' interpreter on CPU here: the same kernel code the TPU compiles, so its masks, segment ids,
GQA grouping and soft cap are checked against `attention.attend_own_keys`, forward and gradients. The TPU test
compiles a train step for a v5p topology with libtpu (no TPU needed) and reads the kernel in its HLO."""
import dataclasses
import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpod.models.llama import attention, kernels
from jaxpod.models.llama.config import tiny

# another test process may hold libtpu's lockfile; compiling for a topology is safe from two processes
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


def _qkv(b, t, h, kvh, e, seed=0):
  rng = np.random.default_rng(seed)
  return (jnp.asarray(rng.standard_normal(s), jnp.float32) for s in ((b, t, h, e), (b, kvh, t, e), (b, kvh, t, e)))


def _value_and_grads(cfg, q, k, v, kv_mask, window):
  """(sum of the real rows' context against fixed weights, its gradients in q, k, v) by cfg.attention."""
  w = jnp.sin(jnp.arange(q.shape[-1], dtype=jnp.float32))
  pos = jnp.broadcast_to(jnp.arange(q.shape[1]), kv_mask.shape)

  def loss(q, k, v):
    ctx = attention.self_attention(cfg, q, k, v, kv_mask, pos, window)
    return jnp.sum(jnp.where(kv_mask[:, :, None, None], ctx, 0.0) * w)
  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(q, k, v)


@pytest.mark.parametrize("t, window, cap", [(256, None, None), (200, 64, 30.0)],
                         ids=["causal", "window_softcap_unaligned"])
def test_splash_matches_xla_forward_and_gradients(t, window, cap):
  """GQA 4/2, head_dim 128, row 1 right-padded (keys hidden by segment ids): splash's context and its gradients in
  q, k and v are the XLA path's to float32 summation order, causally and with a sliding window + soft cap (T=200:
  padded up to the kernel's 128-lane blocks, the padding hidden)."""
  cfg = tiny(num_attention_heads=4, num_key_value_heads=2, head_dim=128, attn_logit_softcapping=cap)
  q, k, v = _qkv(2, t, 4, 2, 128)
  kv_mask = jnp.asarray(np.arange(t)[None] < np.array([[t], [t - 37]]))
  want = _value_and_grads(dataclasses.replace(cfg, attention="xla"), q, k, v, kv_mask, window)
  got = _value_and_grads(dataclasses.replace(cfg, attention="splash"), q, k, v, kv_mask, window)
  for name, a, b in zip(("value", "dq", "dk", "dv"), jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-4, err_msg=name)


def test_splash_in_a_sharded_model_matches_xla_with_sliding_and_full_layers():
  """The whole decoder on a data 2 x model 2 CPU mesh, a sliding layer and a full one in one scan (the window
  traced: both masks' kernels under a cond), splash inside its shard_map: the loss and every weight's gradient
  are the XLA path's."""
  from flax import nnx
  from jaxpod.models.llama import model as M
  from jaxpod.models.llama.loss import next_token_loss
  from jaxpod.runtime import make_mesh
  cfg = tiny(vocab_size=256, layer_types=("sliding_attention", "full_attention"), sliding_window=48)
  tokens = jnp.asarray(np.random.default_rng(1).integers(0, 256, (2, 129)), jnp.int32)
  mesh = make_mesh(devices=jax.devices()[:4], data=2, fsdp=1, model=2)
  out = {}
  for impl in ("xla", "splash"):
    c = dataclasses.replace(cfg, attention=impl)
    graphdef, params = nnx.split(M.init(c, seed=0))
    with jax.set_mesh(mesh):
      out[impl] = jax.jit(jax.value_and_grad(lambda p: next_token_loss(graphdef, p, tokens)[0]))(params)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(out["splash"]), jax.tree.leaves(out["xla"])):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-5, err_msg=jax.tree_util.keystr(path))


def test_cudnn_wrapper_spells_the_same_mask_as_xla():
  """The cuDNN call's arguments (hidden keys as a mask, the window as local_window_size, GQA, the scale) give the
  XLA path's context: checked through jax.nn.dot_product_attention's XLA implementation (no GPU here)."""
  cfg = tiny(num_attention_heads=4, num_key_value_heads=2)
  q, k, v = _qkv(2, 40, 4, 2, 16)
  kv_mask = jnp.asarray(np.arange(40)[None] < np.array([[40], [31]]))
  pos = jnp.broadcast_to(jnp.arange(40), (2, 40))
  xla = jax.jit(attention.self_attention, static_argnums=(0, 6))
  cudnn = jax.jit(kernels.cudnn, static_argnums=(0, 5), static_argnames="implementation")
  for window in (None, 9):
    want = xla(dataclasses.replace(cfg, attention="xla"), q, k, v, kv_mask, pos, window)
    got = cudnn(cfg, q, k, v, kv_mask, window, implementation="xla")
    rows = np.asarray(kv_mask)
    np.testing.assert_allclose(np.asarray(got)[rows], np.asarray(want)[rows], atol=2e-5)


def test_auto_takes_the_platforms_kernel_when_it_serves_the_model():
  """auto: splash on TPU, cuDNN on GPU in bf16 (XLA when cuDNN cannot serve: float32, a soft cap, head_dim 256),
  XLA on CPU; without a mesh the platform is the default backend's."""
  bf16 = tiny(dtype="bfloat16")
  shape = (1, 128, 4, 128)
  assert [kernels.choose(bf16, shape, jnp.bfloat16, where) for where in ("tpu", "gpu", "cpu")] == \
      ["splash", "cudnn", "xla"]
  assert kernels.choose(tiny(), shape, jnp.float32, "gpu") == "xla"
  assert kernels.choose(tiny(attn_logit_softcapping=50.0), shape, jnp.bfloat16, "gpu") == "xla"
  assert kernels.choose(bf16, (1, 128, 4, 256), jnp.bfloat16, "gpu") == "xla"
  assert kernels.platform() == "cpu" and kernels.choose(bf16, shape, jnp.bfloat16) == "xla"


@pytest.mark.parametrize("impl, where, words", [
    ("cudnn", "cpu", "cuDNN attention needs a GPU"),
    ("splash", "gpu", "splash is a TPU kernel"),
    ("cudnn", "gpu", "no logit soft cap"),
])
def test_a_forced_kernel_that_cannot_serve_the_model_refuses_in_one_line(impl, where, words):
  cfg = tiny(dtype="bfloat16", attention=impl, attn_logit_softcapping=50.0)
  with pytest.raises(ValueError) as e:
    kernels.choose(cfg, (1, 128, 4, 128), jnp.bfloat16, where)
  assert str(e.value).startswith(f"model.attention='{impl}' cannot serve this model: ") and words in str(e.value)
  assert "\n" not in str(e.value)


def test_config_names_the_kernels():
  with pytest.raises(ValueError, match="LlamaConfig.attention='flash'"):
    tiny(attention="flash")


needs_libtpu = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None,
    reason="libtpu is not installed (the `test` extra installs it): no TPU compiler to compile with")


def _v5p_mesh():
  """The 4 chips of a v5p:2x2x1 topology (no TPU attached), as data 2 x model 2."""
  from jax.experimental import topologies
  devices = topologies.get_topology_desc(platform="tpu", topology_name="v5p:2x2x1").devices
  return jax.sharding.Mesh(np.array(devices).reshape(2, 1, 2), ("data", "fsdp", "model"))


@needs_libtpu
def test_a_train_step_compiled_for_tpu_runs_splash():
  """A 2-layer bf16 Llama's train step (loss, gradients, AdamW; remat full) compiled for v5p:2x2x1 from this CPU
  machine: `auto` picks splash from the mesh's devices, and the TPU HLO holds its Mosaic kernels (forward, dq,
  dkv) as tpu_custom_calls."""
  from flax import nnx
  from jax.sharding import NamedSharding, PartitionSpec as P
  from jaxpod.models.llama import model as M
  from jaxpod.models.llama.loss import next_token_loss
  from jaxpod.policy.llama_task import AdamWConfig
  from jaxpod.train import state as st, step as sp
  mesh = _v5p_mesh()
  cfg = tiny(vocab_size=512, dtype="bfloat16", remat="full")

  class Task:
    def abstract_model(self, seed):
      return (*nnx.split(M.abstract(cfg)), {})

    def init_model(self, seed):
      return nnx.split(M.Llama(cfg, rngs=nnx.Rngs(params=seed)))[1], {}

    def init_carry(self, b):
      return ()
  tx, lr = AdamWConfig().build(1000)
  graphdef = nnx.split(M.abstract(cfg))[0]
  abstract = st.abstract_state(st.make_init_fn(Task(), tx, 0, 4, ema=False))
  shardings = st.train_state_shardings(abstract, mesh)
  batch_sh = sp.batch_shardings(mesh, {"tokens": 2})

  def loss_fn(params, buffers, batch, rng, carry):
    loss, sums = next_token_loss(graphdef, params, batch["tokens"])
    return loss, (carry, sums)
  step = sp.train_step_fn(loss_fn, tx, 0.0, lr)
  batch = {"tokens": jax.ShapeDtypeStruct((4, 129), jnp.int32, sharding=batch_sh["tokens"])}
  with jax.set_mesh(mesh):
    compiled = jax.jit(step, in_shardings=(shardings, batch_sh), out_shardings=(shardings, NamedSharding(mesh, P())),
                       donate_argnums=(0,)).lower(st.with_shardings(abstract, shardings), batch).compile()
  hlo = compiled.as_text()
  assert "tpu_custom_call" in hlo and all(f"splash_mha_{k}" in hlo for k in ("fwd", "dq", "dkv"))


@needs_libtpu
def test_a_prefill_compiled_for_tpu_runs_splash_per_layer_kind():
  """The engine's prefill (a block per layer, kv_len=0, keys staged) of a sliding + full bf16 model compiled for
  v5p:2x2x1 with the inference shardings: one splash kernel per layer (a LocalMask one and a causal one)."""
  from flax import nnx
  from jax.sharding import NamedSharding, PartitionSpec as P
  from jaxpod.models.llama import model as M, stack
  from jaxpod.models.llama.kv import SlotKVCache
  from jaxpod.runtime import sharding
  mesh = _v5p_mesh()
  cfg = tiny(vocab_size=512, dtype="bfloat16", layer_types=("sliding_attention", "full_attention"), sliding_window=32)
  graphdef, params = nnx.split(stack.unstacked(M.init(cfg)))

  def prefill(params, tokens_BxT):
    out = nnx.merge(graphdef, params)(tokens_BxT, cache=SlotKVCache((), ()), logits_at_B=jnp.full((4,), 127),
                                      kv_len=0)
    return out.logits, out.cache.staged_k
  tokens = jax.ShapeDtypeStruct((4, 128), jnp.int32, sharding=NamedSharding(mesh, P(("data", "fsdp"))))
  with jax.set_mesh(mesh):
    compiled = jax.jit(prefill, in_shardings=(sharding.state_shardings(params, mesh, sharding.INFERENCE),
                                              tokens.sharding)).lower(
        jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params), tokens).compile()
  assert compiled.as_text().count("tpu_custom_call") == cfg.num_hidden_layers
