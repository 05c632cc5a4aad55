"""TRM configs, parameter counts, reference interop, init, halting exploration and bf16 compute."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file

from jaxpod.models import trm

ROOT = Path(__file__).resolve().parents[3]
GOLDEN = ROOT / "tests" / "data" / "golden" / "trm"


def _abstract(cfg):
  return nnx.eval_shape(lambda: trm.TRM(cfg, rngs=nnx.Rngs(0)))


@pytest.mark.parametrize("cfg,expected", [(trm.TRMConfig.sudoku_mlp(), 5_028_866), (trm.TRMConfig.sudoku_att(), 6_828_034)])
def test_paper_parameter_counts(cfg, expected):
  """The paper configurations have the reference's trainable parameter counts (puzzle table excluded)."""
  assert trm.count_params(_abstract(cfg)) == expected
  assert trm.count_params(_abstract(cfg), include_puzzle_emb=True) == expected + cfg.puzzle_emb_ndim


@pytest.mark.parametrize("name,preset", [("trm_sudoku_mlp", trm.TRMConfig.sudoku_mlp()),
                                         ("trm_sudoku_att", trm.TRMConfig.sudoku_att()),
                                         ("trm_tiny", trm.TRMConfig.tiny())])
def test_shipped_configs_parse(name, preset):
  """Every shipped TRM YAML parses, validates and equals its preset."""
  cfg, ocfg, rest = trm.load_configs(str(ROOT / "configs" / f"{name}.yaml"))
  assert cfg == preset
  assert isinstance(ocfg, trm.TRMOptimConfig) and "train" in rest


@pytest.mark.parametrize("field,value", [("hidden_size", 0), ("pos_encodings", "alibi"), ("compute_dtype", "fp8"),
                                         ("halt_exploration_prob", 1.5), ("no_act_continue", False),
                                         ("puzzle_emb_ndim", 10_000), ("puzzle_emb_ndim", 0)])
def test_config_validation_names_the_field(field, value):
  with pytest.raises(ValueError, match=field):
    dataclasses.replace(trm.TRMConfig(), **{field: value})


def test_config_rejects_unknown_yaml_keys(tmp_path):
  path = tmp_path / "bad.yaml"
  path.write_text("model:\n  hidden: 64\n")
  with pytest.raises(ValueError, match="hidden"):
    trm.load_configs(str(path))


@pytest.mark.parametrize("preset", ["tiny", "sudoku_mlp", "sudoku_att"])
def test_to_reference_round_trips(preset):
  """The reference model_config written for `bench trm-step --reference` reads back as the same config."""
  cfg = getattr(trm.TRMConfig, preset)()
  ref = cfg.to_reference(batch_size=8)
  assert ref["batch_size"] == 8 and ref["H_cycles"] == cfg.h_cycles and ref["forward_dtype"] == cfg.compute_dtype
  assert trm.TRMConfig.from_reference(ref) == cfg


def test_trunc_normal_matches_reference_init():
  """Truncated at +-2 sigma and std-compensated: the sample std is the requested std."""
  x = np.asarray(trm.layers.trunc_normal(jax.random.key(0), (200_000,), 0.5))
  assert abs(x.std() - 0.5) < 0.005 and np.abs(x).max() <= 2 * 0.5 / 0.8796 + 1e-6


def test_export_import_round_trip_is_exact(tmp_path):
  """Reference safetensors -> jaxpod -> reference keys, bit for bit; prefixed checkpoints load too."""
  cfg = trm.TRMConfig.from_reference(json.loads((GOLDEN / "config.json").read_text())["model_config"])
  ref = load_file(str(GOLDEN / "weights.safetensors"))
  model = trm.load_reference_state_dict(str(GOLDEN / "weights.safetensors"), cfg)
  out = tmp_path / "export.safetensors"
  exported = trm.export_reference_state_dict(model, str(out))
  assert set(exported) == set(ref)
  for key, value in load_file(str(out)).items():
    assert value.dtype == ref[key].dtype and value.shape == ref[key].shape, key
    np.testing.assert_array_equal(value, ref[key], err_msg=key)
  prefixed = {f"_orig_mod.model.{k}": v for k, v in ref.items()}
  model2 = trm.load_state_dict_into(_abstract(cfg), prefixed)
  for key, value in trm.export_reference_state_dict(model2).items():
    np.testing.assert_array_equal(value, ref[key])
  with pytest.raises(ValueError, match="missing"):
    trm.load_state_dict_into(_abstract(dataclasses.replace(cfg, mlp_t=True)), ref)


@pytest.mark.parametrize("variant", [dict(mlp_t=True, pos_encodings="none"), dict(mlp_t=False, pos_encodings="learned"),
                                     dict(mlp_t=False, pos_encodings="none", puzzle_emb_ndim=0, puzzle_emb_len=0)])
def test_round_trip_every_variant(variant):
  """Export -> import is exact for the MLP, learned-position and no-puzzle-embedding variants."""
  cfg = _small(**variant)
  model = _random_model(cfg, seed=4)
  sd = trm.export_reference_state_dict(model)
  assert ("inner.embed_pos.embedding_weight" in sd) == (cfg.pos_encodings == "learned")
  assert any(".mlp_t." in k for k in sd) == cfg.mlp_t
  again = trm.export_reference_state_dict(trm.load_state_dict_into(_abstract(cfg), sd))
  for key, value in sd.items():
    np.testing.assert_array_equal(again[key], value, err_msg=key)


def test_bf16_reference_checkpoint_round_trip(tmp_path):
  """A bfloat16 reference run stores H_init/L_init as bf16: they load (upcast) and export back as bf16."""
  cfg = _small(compute_dtype="bfloat16")
  sd = trm.export_reference_state_dict(_random_model(cfg, seed=5), str(tmp_path / "bf16.safetensors"))
  assert sd["inner.H_init"].dtype == jnp.bfloat16 and sd["inner.lm_head.weight"].dtype == np.float32
  again = trm.export_reference_state_dict(trm.load_reference_state_dict(str(tmp_path / "bf16.safetensors"), cfg))
  for key, value in sd.items():
    assert again[key].dtype == value.dtype, key
    np.testing.assert_array_equal(again[key].astype(np.float32), value.astype(np.float32), err_msg=key)


def _random_model(cfg, seed=0):
  model = _abstract(cfg)
  rng = np.random.default_rng(seed)
  for _, var in nnx.iter_graph(model):
    if isinstance(var, nnx.Variable):
      var.set_value(jnp.asarray(rng.normal(size=var.shape) / np.sqrt(var.shape[0]), jnp.float32))
  return model


def _small(**kw):
  kw = {"seq_len": 8, "vocab_size": 5, "hidden_size": 32, "num_heads": 2, "puzzle_emb_ndim": 32, **kw}
  return dataclasses.replace(trm.TRMConfig.tiny(), **kw)


def _batch(cfg, b, seed=0):
  rng = np.random.default_rng(seed)
  return {"inputs": jnp.asarray(rng.integers(1, cfg.vocab_size, (b, cfg.seq_len)), jnp.int32),
          "labels": jnp.asarray(rng.integers(1, cfg.vocab_size, (b, cfg.seq_len)), jnp.int32),
          "puzzle_identifiers": jnp.zeros((b,), jnp.int32)}


def test_exploration_delays_halting_in_train_only():
  """With exploration probability 1 no row halts before step 2 (minimum drawn in [2, max]); max always halts."""
  cfg = _small(halt_exploration_prob=1.0, mlp_t=True, pos_encodings="learned", h_cycles=1, l_cycles=1, l_layers=1)
  model = _random_model(cfg)
  model.q_head_bias.set_value(jnp.array([50.0, 0.0]))  # q_halt >> 0: every row wants to halt at once
  graphdef, params, buffers = trm.split_model(model)
  step = jax.jit(trm.act_step, static_argnums=(0, 6))
  batch = _batch(cfg, 16)
  carry = trm.init_carry(cfg, 16)
  halted_any = False
  for i in range(2 * cfg.halt_max_steps):  # the minimum is drawn afresh at every step, as the reference
    carry, _ = step(graphdef, params, buffers, carry, batch, jax.random.key(i), True)
    steps, halted = np.asarray(carry.steps), np.asarray(carry.halted)
    assert not halted[steps < 2].any() and halted[steps >= cfg.halt_max_steps].all()
    halted_any |= bool(halted.any())
  assert halted_any


def test_bf16_compute_keeps_fp32_params_and_tracks_fp32():
  """compute_dtype=bfloat16: params and grads stay fp32, carries are bf16, outputs near the fp32 ones."""
  cfg32 = _small(h_cycles=2, l_cycles=1, halt_exploration_prob=0.0)
  cfg16 = dataclasses.replace(cfg32, compute_dtype="bfloat16")
  batch = _batch(cfg32, 4)
  outs = {}
  for cfg in (cfg32, cfg16):
    graphdef, params, buffers = trm.split_model(_random_model(cfg))
    step = jax.jit(trm.act_step, static_argnums=(0, 6))
    outs[cfg.compute_dtype] = step(graphdef, params, buffers, trm.init_carry(cfg, 4), batch, None, True)
  grads16, _ = jax.eval_shape(jax.grad(trm.train_loss, argnums=1, has_aux=True), graphdef, params, buffers,
                              trm.init_carry(cfg16, 4), batch, None)
  assert all(g.dtype == jnp.float32 for g in jax.tree.leaves(grads16))
  assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(params))
  carry16, out16 = outs["bfloat16"]
  assert carry16.z_H.dtype == jnp.bfloat16 and out16["q_halt_logits"].dtype == jnp.float32
  ref = np.asarray(outs["float32"][1]["logits"])
  rel = np.linalg.norm(np.asarray(out16["logits"], np.float32) - ref) / np.linalg.norm(ref)
  # bf16 keeps ~3 significant digits: a few % after the 4 calls of this random (untrained) net.
  assert rel < 0.15, rel


def test_cross_entropies_match_numpy_float64():
  """Stablemax CE (the reference computes it in float64) and softmax CE, ignore label -100."""
  rng = np.random.default_rng(3)
  logits = (rng.normal(size=(3, 7, 11)) * 4).astype(np.float32)
  labels = rng.integers(0, 11, (3, 7)).astype(np.int32)
  labels[1, 2] = trm.IGNORE_LABEL_ID
  valid = labels != trm.IGNORE_LABEL_ID
  x = logits.astype(np.float64)
  s = np.where(x < 0, 1 / (1 - x + 1e-30), x + 1)
  logp = np.log(s / s.sum(-1, keepdims=True))
  safe = np.where(valid, labels, 0)
  want = -np.where(valid, np.take_along_axis(logp, safe[..., None], -1)[..., 0], 0)
  got = trm.stablemax_cross_entropy(jnp.asarray(logits), jnp.asarray(labels), jnp.asarray(valid))
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-7)
  lsm = x - np.log(np.exp(x).sum(-1, keepdims=True))
  want = -np.where(valid, np.take_along_axis(lsm, safe[..., None], -1)[..., 0], 0)
  got = trm.softmax_cross_entropy(jnp.asarray(logits), jnp.asarray(labels), jnp.asarray(valid))
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
