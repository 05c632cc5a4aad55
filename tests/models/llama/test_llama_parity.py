"""Logits parity with transformers (torch CPU) on tiny random checkpoints written by transformers.

fp32 tolerance: 1e-5 absolute on logits of magnitude ~1. Both sides compute in float32 with
the same op order up to matmul summation order and softmax/rsqrt implementations; measured
max abs error is 2e-7 .. 4e-7 (printed with -s), i.e. a few float32 ulps, so 1e-5 leaves 25x
margin for BLAS differences while any real bug (a wrong RoPE, GQA mapping or norm eps)
gives errors of 1e-3 or more.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from jaxpod.models.llama import forward, hf_io
from jaxpod.runtime import make_mesh

from hf_checkpoints import write_hf_checkpoint

TOL = 1e-5
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16}


def _tokens(vocab, b=2, t=24, seed=0):
  return np.random.default_rng(seed).integers(0, vocab, (b, t)).astype(np.int32)


def _parity(folder, hf_model, mesh=None, t=24):
  mesh = mesh or make_mesh(devices=jax.devices()[:1])
  model = hf_io.load(folder, mesh)
  tokens = _tokens(model.cfg.vocab_size, t=t)
  with torch.no_grad():
    want = hf_model(torch.from_numpy(tokens).long()).logits.float().numpy()
  g, p = nnx.split(model)
  got = np.asarray(jax.jit(lambda p, t: forward(g, p, t).logits)(p, tokens))
  err = float(np.max(np.abs(got - want)))
  assert err < TOL, f"max abs logits error {err:.2e} >= {TOL}"
  return err


def test_parity_gqa_untied(hf_gqa):
  folder, hf_model = hf_gqa
  print("gqa untied max abs err", _parity(folder, hf_model))


def test_parity_tied_mha(tmp_path):
  hf_model = write_hf_checkpoint(tmp_path, seed=1, tie_word_embeddings=True, num_key_value_heads=4)
  print("tied max abs err", _parity(str(tmp_path), hf_model))


def test_parity_llama3_rope_old_config_keys(tmp_path):
  """Llama-3 rope scaling, read both from rope_parameters and from old rope_theta/rope_scaling keys."""
  import json
  hf_model = write_hf_checkpoint(tmp_path, seed=2, rope_parameters=dict(LLAMA3_ROPE))
  print("llama3 max abs err", _parity(str(tmp_path), hf_model))
  cfg_path = tmp_path / "config.json"
  raw = json.loads(cfg_path.read_text())
  rope = raw.pop("rope_parameters")
  raw["rope_theta"] = rope.pop("rope_theta")
  raw["rope_scaling"] = rope
  cfg_path.write_text(json.dumps(raw))
  cfg = hf_io.load_config(str(tmp_path))
  assert (cfg.rope_type, cfg.rope_theta, cfg.rope_factor) == ("llama3", 500000.0, 8.0)
  _parity(str(tmp_path), hf_model)


def test_parity_long_call_in_query_blocks(hf_gqa):
  """160 tokens: attention without a cache runs in 3 blocks of 64 query rows (`models/llama/attention.py`)."""
  _parity(*hf_gqa, t=160)


def test_parity_sharded_mesh(hf_gqa):
  """Loading straight into a (fsdp=2, model=2) sharding gives the same logits."""
  folder, hf_model = hf_gqa
  if len(jax.devices()) < 4:
    pytest.skip("needs 4 devices (XLA_FLAGS=--xla_force_host_platform_device_count=4)")
  mesh = make_mesh(data=1, fsdp=2, model=2, devices=jax.devices()[:4])
  with jax.set_mesh(mesh):
    _parity(folder, hf_model, mesh)


def test_captures_match_hidden_states(hf_gqa):
  folder, hf_model = hf_gqa
  model = hf_io.load(folder, make_mesh(devices=jax.devices()[:1]))
  tokens = _tokens(model.cfg.vocab_size)
  with torch.no_grad():
    hs = hf_model(torch.from_numpy(tokens).long(), output_hidden_states=True).hidden_states
  out = model(jnp.asarray(tokens), capture_layers=(0,), capture_points=("resid", "attn_out", "mlp_out"))
  np.testing.assert_allclose(np.asarray(out.captures["resid.0"]), hs[1].numpy(), atol=TOL)
  # resid.0 = embed + attn_out.0 + mlp_out.0
  emb = np.asarray(model.embed_tokens[...])[tokens]
  total = emb + np.asarray(out.captures["attn_out.0"]) + np.asarray(out.captures["mlp_out.0"])
  np.testing.assert_allclose(np.asarray(out.captures["resid.0"]), total, atol=1e-5)
  with pytest.raises(ValueError, match="capture_layers"):
    model(jnp.asarray(tokens), capture_layers=(5,), capture_points=("resid",))


def test_padding_and_causality_properties():
  """Right padding with kv_mask leaves real positions unchanged; later tokens never change earlier logits."""
  from jaxpod.models.llama import init, tiny
  model = init(tiny(), seed=5)
  g, p = nnx.split(model)
  fwd = jax.jit(lambda p, t, m: forward(g, p, t, kv_mask_BxS=m, capture_layers=(1,), capture_points=("resid",)))
  tokens = _tokens(300, b=1, t=12, seed=3)
  full = fwd(p, tokens, np.ones((1, 12), bool))
  padded = np.concatenate([tokens[:, :7], np.zeros((1, 5), np.int32)], axis=1)
  part = fwd(p, padded, np.arange(12)[None] < 7)
  np.testing.assert_allclose(np.asarray(part.logits[:, :7]), np.asarray(full.logits[:, :7]), atol=1e-6)
  np.testing.assert_allclose(np.asarray(part.captures["resid.1"][:, :7]), np.asarray(full.captures["resid.1"][:, :7]),
                             atol=1e-6)
