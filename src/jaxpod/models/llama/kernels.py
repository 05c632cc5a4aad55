"""Attention kernels of the cache-free path (training, scoring, prefill): which one runs, and the wrappers.

    impl = choose(cfg, q_BxTxHxE.shape, q_BxTxHxE.dtype)        # "xla" | "splash" | "cudnn"
    ctx_BxTxHxE = attend(impl, cfg, q, k_BxKxTxE, v_BxKxTxE, kv_mask_BxT, window)   # any impl but "xla"

`LlamaConfig.attention` names the kernel: `auto` (default) takes splash on TPU, cuDNN on GPU where it serves the
model, XLA (`attention.attend_own_keys`) otherwise; `xla`, `splash` and `cudnn` force one, and a kernel that cannot
serve the model refuses in one line naming `model.attention`. The platform is that of the current mesh's devices
(`jax.set_mesh`), so a program compiled ahead of time for a TPU topology on a CPU machine gets splash; without a
mesh, `jax.default_backend()`'s. On CPU `splash` runs in Pallas' interpreter (the parity tests).

Splash (`jax.experimental.pallas.ops.tpu.splash_attention`) computes the same rule as the XLA path: causal over
slots, keys with kv_mask False hidden (segment ids: a hidden key is segment 0, every query segment 1), a sliding
window as `LocalMask` (keys j with i - window < j <= i), GQA by the kernel's own grouping (query head j reads kv
head j // G), soft caps by its `attn_logits_soft_cap`. It is one row's kernel, vmapped over the rows, inside a
`jax.shard_map` over the mesh: Mosaic kernels cannot be partitioned by XLA, so each device runs it on its rows
(the batch's mesh axes) and its heads (the model axis, when the kv heads split over it; otherwise every model
shard computes all heads). T is padded up to a multiple of 128 (the kernel's lane width), the padding hidden
as segment 0. Why: it never writes the [T, T] scores; Llama-3-8B's train step on v5p-64 holds 1.26 GiB less per
chip at one 4096-token row with it, 7 GiB less at four (docs/scale.md, `jaxpod plan --compile`).

The window counts slots here, positions on XLA's path: the same whenever a row's positions are its slots plus a
constant (every caller of the cache-free path). A stack of sliding and full layers (one scan, the layer's window
traced) runs both masks' kernels under a `lax.cond`. Attention sinks are not wired: no family here has them
(splash takes them, `sinks=`, when one does).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxpod.models.llama.config import attention_kernel
from jaxpod.runtime import sharding

LANES = 128  # splash's block sizes are multiples of this; T is padded up to one
BLOCKS = (512, 256, 128)  # splash's query/key block: the largest that divides the padded T
_GPU = ("gpu", "cuda", "rocm")


def platform() -> str:
  """The backend attention compiles for: the current mesh's devices' platform, else `jax.default_backend()`."""
  mesh = sharding._current_mesh()
  name = None
  if mesh is not None:
    device = getattr(mesh, "abstract_device", None)
    if device is not None:
      name = device.platform
    elif getattr(mesh, "devices", None) is not None and np.size(mesh.devices):
      name = np.asarray(mesh.devices).flat[0].platform
  name = (name or jax.default_backend()).lower()
  return "gpu" if name in _GPU else name


def choose(cfg, shape_BxTxHxE, dtype, where: str | None = None) -> str:
  """The kernel that runs for these shapes on `where` (None: this program's platform): config.attention_kernel."""
  return attention_kernel(cfg, platform() if where is None else where, shape_BxTxHxE[-1], jnp.dtype(dtype).name)


def attend(impl: str, cfg, q_BxTxHxE, k_BxKxTxE, v_BxKxTxE, kv_mask_BxT, window):
  """Context [B, T, H, E] by kernel `impl` (splash or cudnn): causal over slots, hidden keys and window applied.
  window: None, an int, or traced (a scanned stack of both kinds: `stack.NO_WINDOW` for a full layer)."""
  run = {"splash": splash, "cudnn": cudnn}[impl]
  if window is None or isinstance(window, (int, np.integer)):
    return run(cfg, q_BxTxHxE, k_BxKxTxE, v_BxKxTxE, kv_mask_BxT, None if window is None else int(window))
  from jaxpod.models.llama.stack import NO_WINDOW
  args = (q_BxTxHxE, k_BxKxTxE, v_BxKxTxE, kv_mask_BxT)
  return jax.lax.cond(window < NO_WINDOW, lambda *a: run(cfg, *a, cfg.sliding_window), lambda *a: run(cfg, *a, None),
                      *args)


def splash(cfg, q_BxTxHxE, k_BxKxTxE, v_BxKxTxE, kv_mask_BxT, window: int | None, interpret: bool | None = None):
  """Splash attention (see the module docstring); `interpret` defaults to True off TPU (Pallas' interpreter)."""
  from jax.experimental.pallas.ops.tpu import splash_attention as sa
  interpret = platform() != "tpu" if interpret is None else interpret
  b, t, h, e = q_BxTxHxE.shape
  kvh = k_BxKxTxE.shape[1]
  tp = -(-t // LANES) * LANES
  q_BxHxTxE = (q_BxTxHxE * jnp.asarray(cfg.attn_scale, q_BxTxHxE.dtype)).transpose(0, 2, 1, 3)
  seg_BxT = kv_mask_BxT.astype(jnp.int32)
  if tp != t:  # pad the slots; padded keys are segment 0 (hidden), padded queries are cut off below
    q_BxHxTxE, k_BxKxTxE, v_BxKxTxE = (jnp.pad(x, ((0, 0), (0, 0), (0, tp - t), (0, 0)))
                                       for x in (q_BxHxTxE, k_BxKxTxE, v_BxKxTxE))
    seg_BxT = jnp.pad(seg_BxT, ((0, 0), (0, tp - t)))
  block = next(n for n in BLOCKS if tp % n == 0)
  sizes = sa.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                        block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)

  def local(q_bxhxTxE, k_bxkxTxE, v_bxkxTxE, seg_bxT):
    """One device's rows and heads: the kernel built for its head count, vmapped over its rows."""
    heads = q_bxhxTxE.shape[1]
    one = sa.CausalMask((tp, tp)) if window is None else sa.LocalMask((tp, tp), (window - 1, 0), offset=0)
    kernel = sa.make_splash_mha(sa.MultiHeadMask([one] * heads), block_sizes=sizes, head_shards=1, q_seq_shards=1,
                                attn_logits_soft_cap=cfg.attn_logit_softcapping, interpret=interpret)
    ids = sa.SegmentIds(q=jnp.ones_like(seg_bxT), kv=seg_bxT)
    return jax.vmap(kernel)(q_bxhxTxE, k_bxkxTxE, v_bxkxTxE, ids)

  mesh = sharding._current_mesh()
  if mesh is None:
    out_BxHxTxE = local(q_BxHxTxE, k_BxKxTxE, v_BxKxTxE, seg_BxT)
  else:
    P = jax.sharding.PartitionSpec
    rows = sharding.DEFAULT.fitted_spec(("batch",), (b,), mesh, "attention rows")[0]
    heads = sharding.DEFAULT.fitted_spec(("kv_heads",), (kvh,), mesh, "attention kv heads")[0]
    if heads is not None and h % _size(mesh, heads):
      heads = None
    qs, ss = P(rows, heads, None, None), P(rows, None)
    out_BxHxTxE = jax.shard_map(local, mesh=mesh, in_specs=(qs, qs, qs, ss), out_specs=qs,
                                check_vma=False)(q_BxHxTxE, k_BxKxTxE, v_BxKxTxE, seg_BxT)
  return out_BxHxTxE[:, :, :t].transpose(0, 2, 1, 3)


def cudnn(cfg, q_BxTxHxE, k_BxKxTxE, v_BxKxTxE, kv_mask_BxT, window: int | None, implementation: str = "cudnn"):
  """`jax.nn.dot_product_attention` (cuDNN's fused kernel; `implementation="xla"` checks the arguments on CPU):
  causal, hidden keys as a [B, 1, 1, T] mask, the window as `local_window_size` (window - 1 keys back)."""
  k_BxTxKxE, v_BxTxKxE = k_BxKxTxE.transpose(0, 2, 1, 3), v_BxKxTxE.transpose(0, 2, 1, 3)
  return jax.nn.dot_product_attention(
      q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, mask=kv_mask_BxT[:, None, None, :], scale=cfg.attn_scale, is_causal=True,
      local_window_size=None if window is None else (window - 1, 0), implementation=implementation)


def _size(mesh, axes) -> int:
  """Devices along mesh axis or axes `axes`."""
  names = axes if isinstance(axes, tuple) else (axes,)
  return int(np.prod([mesh.shape[n] for n in names]))
