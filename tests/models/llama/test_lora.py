"""LoRA adapters on the decoder (models/llama/lora.py): zero at init, only adapters train, merged export equals
the unmerged forward, shardings follow the base, bad input fails in one line."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from jaxpod.models.llama import hf_io, init, lora, peft_io, tiny
from jaxpod.runtime import make_mesh
from tests.models.llama.test_families import TOL, _hf_logits, _logits, _mesh, _tokens


def _randomize(model, seed=1, b_scale=0.05):
  """Nonzero A and B on every adapter (B starts at zero)."""
  rng = np.random.default_rng(seed)
  lora.set_adapters(model, {k: (rng.standard_normal(a.shape) * 0.1, rng.standard_normal(b.shape) * b_scale)
                            for k, (a, b) in lora.adapters(model).items()})
  return model


@pytest.mark.slow
def test_adapters_start_at_zero_and_are_the_only_gradients():
  """B = 0: logits equal the base's bit for bit; grads taken w.r.t. nnx.LoRAParam hold adapters only, and an
  optimizer built on them holds no base-shaped state."""
  import optax
  cfg = tiny()
  model = init(cfg)
  tokens = _tokens(t=12)
  base = _logits(model, tokens)
  lora.attach(model, lora.LoraConfig(rank=4))
  np.testing.assert_array_equal(_logits(model, tokens), base)
  adapters = nnx.state(model, nnx.LoRAParam)
  paths = [p for p, _ in nnx.to_flat_state(adapters)]
  assert len(paths) == 2 * 7 and all(p[-1] in ("lora_a", "lora_b") for p in paths)  # A and B per projection
  assert all(v.shape[0] == cfg.num_hidden_layers for _, v in nnx.to_flat_state(adapters))  # stacked like the blocks

  graphdef, trained, frozen = nnx.split(model, nnx.LoRAParam, ...)  # the train step's split: grads on `trained`

  def loss(trained, frozen):
    return nnx.merge(graphdef, trained, frozen)(tokens).logits.mean()
  grads = jax.jit(jax.grad(loss))(trained, frozen)
  assert [p for p, _ in nnx.to_flat_state(grads)] == paths
  assert any(float(jnp.abs(g.get_value()).max()) > 0 for _, g in nnx.to_flat_state(grads))  # A gets none at B = 0
  opt = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.LoRAParam)
  base_shapes = {tuple(v.shape) for _, v in nnx.to_flat_state(nnx.state(model, nnx.Not(nnx.LoRAParam)))}
  opt_shapes = {tuple(x.shape) for x in jax.tree.leaves(nnx.state(opt, nnx.OptState)) if x.ndim > 1}
  assert opt_shapes and not opt_shapes & base_shapes, opt_shapes & base_shapes


def test_scale_and_merge_match_the_formula():
  """s = alpha / r (alpha / sqrt(r) with rsLoRA); merged W' = W + s * A B gives the adapted logits."""
  assert lora.LoraConfig(rank=4, alpha=8).scale == 2.0
  assert lora.LoraConfig(rank=4, alpha=8, rslora=True).scale == 4.0
  model = _randomize(lora.attach(init(tiny()), lora.LoraConfig(rank=4, alpha=8, rslora=True)))
  plain = lora.merged(model)
  assert lora.lora_config(plain) is None and not nnx.state(plain, nnx.LoRAParam)
  a, b = lora.adapters(model)[(1, "o_proj")]
  w, w2 = model.layers.self_attn.o_proj[...][1], plain.layers.self_attn.o_proj[...][1]
  np.testing.assert_allclose(w2, w + 4.0 * (a @ b).reshape(w.shape), atol=1e-6)
  tokens = _tokens(t=12)
  np.testing.assert_allclose(_logits(plain, tokens), _logits(model, tokens), atol=TOL)


@pytest.mark.slow
def test_merged_export_is_a_plain_hf_checkpoint_with_the_adapted_logits(hf_family, tmp_path):
  """hf_io.save of an adapted Qwen3 writes W + s * A B: transformers (no peft) and jaxpod read back the adapted
  model's logits."""
  from transformers import AutoModelForCausalLM
  folder, _ = hf_family("qwen3")
  model = _randomize(lora.attach(hf_io.load(folder, _mesh()), lora.LoraConfig(rank=2, alpha=4)))
  hf_io.save(model, str(tmp_path))
  tokens = _tokens(seed=4)
  want = _logits(model, tokens)
  back_hf = AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
  err = float(np.max(np.abs(_hf_logits(back_hf, tokens) - want)))
  print(f"merged export vs unmerged forward: max abs logits diff {err:.1e}")
  assert err < TOL
  np.testing.assert_allclose(_logits(hf_io.load(str(tmp_path), _mesh()), tokens), want, atol=TOL)


def test_adapters_are_sharded_like_their_base_dims():
  """On a (fsdp 2, model 2) mesh: A's input dim follows the base's input dim, B's output its output, rank whole."""
  mesh = make_mesh(devices=jax.devices()[:4], data=1, fsdp=2, model=2)
  model = lora.attach(init(tiny()), lora.LoraConfig(rank=4), mesh=mesh)
  attn, mlp = model.layers.self_attn, model.layers.mlp
  q_spec = (attn.q_proj_lora.lora.lora_a[...], attn.q_proj_lora.lora.lora_b[...])
  from jaxpod.runtime.sharding import DEFAULT
  assert q_spec[0].sharding.spec == DEFAULT.spec(("layers", "embed", None), mesh)
  assert q_spec[1].sharding.spec == DEFAULT.spec(("layers", None, "heads"), mesh)
  assert attn.o_proj_lora.lora.lora_a[...].sharding.spec == DEFAULT.spec(("layers", "heads", None), mesh)
  assert mlp.down_proj_lora.lora.lora_b[...].sharding.spec == DEFAULT.spec(("layers", None, "embed"), mesh)
  assert any(s is not None for s in q_spec[1].sharding.spec)  # the rules do shard something here


def test_bad_config_is_one_line():
  with pytest.raises(ValueError, match=r"LoraConfig.rank=0 must be an integer >= 1"):
    lora.LoraConfig(rank=0)
  with pytest.raises(ValueError, match=r"\['qkv_proj'\] unknown; use some of"):
    lora.LoraConfig(target_modules=("q_proj", "qkv_proj"))
  assert lora.LoraConfig(target_modules="q_proj, v_proj").target_modules == ("q_proj", "v_proj")  # a YAML scalar


def test_an_adapter_for_another_base_names_the_tensor_and_both_shapes(tmp_path):
  """Checked from the files alone (no JAX): a wrong shape, a regex target and DoRA each fail in one line."""
  small = lora.attach(init(tiny()), lora.LoraConfig(rank=2, target_modules=("q_proj", "down_proj")))
  peft_io.save_adapter(small, str(tmp_path))
  assert peft_io.check_adapter(str(tmp_path), tiny()).target_modules == ("q_proj", "down_proj")
  wide = tiny(intermediate_size=96)
  with pytest.raises(ValueError, match=r"adapter tensor base_model\.model\.model\.layers\.0\.mlp\.down_proj\.lora_A"
                                       r"\.weight .* has shape \(2, 128\); this model \(config.json\) needs \(2, 96\)"):
    peft_io.check_adapter(str(tmp_path), wide)
  with pytest.raises(ValueError, match=r"lacks \['base_model\.model\.model\.layers\.2\."):
    peft_io.check_adapter(str(tmp_path), tiny(num_hidden_layers=3))
  raw = json.loads((tmp_path / peft_io.CONFIG_FILE).read_text())
  for change, msg in (({"target_modules": ".*proj"}, "is a regex"), ({"use_dora": True}, "use_dora=True"),
                      ({"r": 0}, "rank=0 must be"), ({"target_modules": ["q_proj", "lm_head"]}, r"\['lm_head'\] unknown")):
    (tmp_path / peft_io.CONFIG_FILE).write_text(json.dumps(raw | change))
    with pytest.raises(ValueError, match=msg):
      peft_io.read_config(str(tmp_path))


@pytest.mark.slow
def test_adapter_round_trips_through_a_bucket(bucket):
  """save_adapter / load_adapter on gs:// (the test GCS server): the same adapters and logits come back."""
  model = _randomize(lora.attach(init(tiny()), lora.LoraConfig(rank=3, alpha=5)))
  url = f"{bucket}/run/adapter"
  peft_io.save_adapter(model, url)
  back = peft_io.load_adapter(init(tiny()), url)
  assert lora.lora_config(back) == lora.lora_config(model)
  for k, (a, b) in lora.adapters(model).items():
    np.testing.assert_array_equal(np.asarray(lora.adapters(back)[k][0]), np.asarray(a))
    np.testing.assert_array_equal(np.asarray(lora.adapters(back)[k][1]), np.asarray(b))
  tokens = _tokens(t=10)
  np.testing.assert_array_equal(_logits(back, tokens), _logits(model, tokens))
