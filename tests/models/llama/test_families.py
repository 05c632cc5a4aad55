"""Every decoder family against transformers on its tiny random checkpoint (tests/hf_families.py): logits on a
sequence longer than the sliding window, export that transformers reads back, and the family registry's errors.

fp32 tolerance 1e-5 as in test_llama_parity.py (measured 2e-7 .. 5e-7)."""
import dataclasses
import json
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
import torch
from flax import nnx

from jaxpod.models.llama import LlamaConfig, forward, hf_io
from jaxpod.runtime import make_mesh
from tests.hf_families import FAMILIES, SLIDING, WINDOW

TOL = 1e-5
T = 3 * WINDOW  # parity sequences reach three windows back


def _mesh():
  return make_mesh(devices=jax.devices()[:1])


def _tokens(b=2, t=T, seed=0):
  return np.random.default_rng(seed).integers(0, 300, (b, t)).astype(np.int32)


def _logits(model, tokens):
  g, p = nnx.split(model)
  return np.asarray(jax.jit(lambda p, t: forward(g, p, t).logits)(p, tokens))


def _hf_logits(hf_model, tokens):
  with torch.no_grad():
    return hf_model(torch.from_numpy(tokens).long()).logits.float().numpy()


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_transformers_past_the_window(hf_family, family):
  """fp32 logits within 1e-5 of transformers' on 24 tokens (window 8); for sliding families the window matters:
  the same weights with full attention give logits more than 100x the tolerance away."""
  folder, hf_model = hf_family(family)
  model = hf_io.load(folder, _mesh())
  assert model.cfg.model_type == family
  # the memory checks' parameter count covers every family parameter
  assert model.cfg.num_params() == sum(p.numel() for p in hf_model.parameters())
  tokens = _tokens()
  want = _hf_logits(hf_model, tokens)
  err = float(np.max(np.abs(_logits(model, tokens) - want)))
  print(f"{family} max abs logits error {err:.1e}")
  assert err < TOL
  if family in SLIDING:
    full = hf_io.load(folder, _mesh(), layer_types=(), sliding_window=None)
    assert float(np.max(np.abs(_logits(full, tokens) - want))) > 100 * TOL


@pytest.mark.parametrize("family", FAMILIES)
def test_export_sharded_round_trip_loads_in_transformers(hf_family, family, tmp_path):
  """jaxpod -> sharded HF safetensors + index -> transformers: same logits; back into jaxpod: identical tensors
  and config (the config.json each family writes reads back to the same switches)."""
  from transformers import AutoModelForCausalLM
  folder, _ = hf_family(family)
  model = hf_io.load(folder, _mesh())
  hf_io.save(model, str(tmp_path), max_shard_bytes=64 * 1024)
  index = json.loads((tmp_path / hf_io.INDEX_FILE).read_text())
  assert len(set(index["weight_map"].values())) > 1
  tokens = _tokens(seed=1)
  back_hf = AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
  assert type(back_hf).__name__ == hf_config_arch(family)
  np.testing.assert_allclose(_logits(model, tokens), _hf_logits(back_hf, tokens), atol=TOL)
  back = hf_io.load(str(tmp_path), _mesh())
  assert back.cfg == dataclasses.replace(model.cfg, head_dim=model.cfg.head_dim_)  # export writes head_dim
  for (p, a), (_, b) in zip(nnx.to_flat_state(nnx.state(model)), nnx.to_flat_state(nnx.state(back))):
    np.testing.assert_array_equal(np.asarray(a.get_value()), np.asarray(b.get_value()), err_msg=str(p))


def hf_config_arch(family):
  from jaxpod.models.llama.families import family as family_module
  return family_module(family).ARCHITECTURE


def test_bf16_export_of_a_tied_family_reads_back_in_transformers(hf_family, tmp_path):
  """Gemma 3 (tied head, (1 + w) norms) exported in bf16: transformers' bf16 logits agree with jaxpod's."""
  from transformers import AutoModelForCausalLM
  folder, _ = hf_family("gemma3_text")
  model = hf_io.load(folder, _mesh(), dtype="bfloat16")
  hf_io.save(model, str(tmp_path))
  assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bfloat16"
  back_hf = AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
  assert back_hf.dtype == torch.bfloat16
  tokens = _tokens(seed=2)
  err = np.max(np.abs(_logits(model, tokens) - _hf_logits(back_hf, tokens)))
  assert err < 5e-2, err  # bf16: 8 mantissa bits on O(1) logits
  assert hf_io.load(str(tmp_path), _mesh()).embed_tokens[...].dtype == jax.numpy.bfloat16


def test_a_tensor_the_model_does_not_use_is_an_error(hf_family, tmp_path):
  """A Qwen2 checkpoint whose config.json says llama would lose its q/k/v biases: loading names them."""
  folder, _ = hf_family("qwen2")
  shutil.copytree(folder, tmp_path, dirs_exist_ok=True)
  raw = json.loads((tmp_path / "config.json").read_text())
  (tmp_path / "config.json").write_text(json.dumps(raw | {"model_type": "llama", "use_sliding_window": False}))
  with pytest.raises(ValueError, match=r"has tensor\(s\) \['model\.layers\.0\.self_attn\.k_proj\.bias'.*does not use"):
    hf_io.load(str(tmp_path), _mesh())


PHI3 = {"model_type": "phi3", "vocab_size": 300, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4}
_NO_BACKEND = ("import sys\nfrom jax._src import xla_bridge\nfrom jaxpod.cli.main import main\n"
               "code = main(sys.argv[1:])\nprint('backend started', bool(xla_bridge._backends))\nsys.exit(code)\n")


def test_a_tied_head_stored_twice_loads_but_a_different_one_is_refused(hf_family, tmp_path):
  """Qwen3 (tied): a checkpoint that also stores lm_head.weight equal to the embedding loads (some exports do);
  a different lm_head under tie_word_embeddings=true would be dropped, so it is an error naming the fix."""
  from safetensors import safe_open
  from safetensors.numpy import save_file
  folder, _ = hf_family("qwen3")
  shutil.copytree(folder, tmp_path, dirs_exist_ok=True)
  with safe_open(f"{folder}/model.safetensors", "numpy") as f:
    tensors = {k: f.get_tensor(k) for k in f.keys()}
  save_file({**tensors, "lm_head.weight": tensors["model.embed_tokens.weight"]}, f"{tmp_path}/model.safetensors")
  tokens = _tokens(seed=3)
  np.testing.assert_array_equal(_logits(hf_io.load(str(tmp_path), _mesh()), tokens),
                                _logits(hf_io.load(folder, _mesh()), tokens))
  save_file({**tensors, "lm_head.weight": tensors["model.embed_tokens.weight"] + 1}, f"{tmp_path}/model.safetensors")
  with pytest.raises(ValueError, match=r"\['lm_head\.weight'\].*set it false"):
    hf_io.load(str(tmp_path), _mesh())


@pytest.mark.parametrize("command", ["sample", "extract", "rl"])
def test_unknown_model_type_is_one_line_naming_the_supported_ones_before_jax(tmp_path, command):
  """A phi3 checkpoint: one line naming phi3 and every supported family, before any JAX backend starts."""
  (tmp_path / "config.json").write_text(json.dumps(PHI3))
  (tmp_path / "p.txt").write_text("hi\n")
  args = {"extract": ["--layers", "0", "--out", str(tmp_path / "out")],
          "sample": ["--out", str(tmp_path / "o.jsonl")]}.get(command, [])
  model = ["--model.hf", str(tmp_path), "--trainer.runs_dir", str(tmp_path / "runs")] if command == "rl" else [
      "--hf", str(tmp_path), "--prompts", str(tmp_path / "p.txt")]
  out = subprocess.run([sys.executable, "-c", _NO_BACKEND, command, *model, *args], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path)
  text = out.stdout + out.stderr
  assert out.returncode == 2, text
  lines = [l for l in text.splitlines() if "model_type='phi3'" in l]
  assert len(lines) == 1 and all(f in lines[0] for f in ("llama", *FAMILIES)), text
  assert "backend started False" in text, text


def test_config_errors_name_the_field():
  with pytest.raises(ValueError, match="layer_types has 1 entries for num_hidden_layers=2"):
    LlamaConfig(num_hidden_layers=2, layer_types=("full_attention",))
  with pytest.raises(ValueError, match="sliding layers but sliding_window=None"):
    LlamaConfig(num_hidden_layers=1, layer_types=("sliding_attention",))
  with pytest.raises(ValueError, match="final_logit_softcapping=30.0"):
    LlamaConfig.from_hf_config({"model_type": "gemma3_text", "final_logit_softcapping": 30.0, "vocab_size": 1,
                                "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1,
                                "num_attention_heads": 1})
