"""HF checkpoint I/O: sharded index files, fsspec URLs, export round trip, clear shape errors; tokenizers."""
import json

import fsspec
import jax
import numpy as np
import pytest
import torch
from flax import nnx

from jaxpod.models.llama import ByteTokenizer, forward, hf_io, init, load_tokenizer, tiny
from jaxpod.runtime import make_mesh


def _mesh():
  return make_mesh(devices=jax.devices()[:1])


def _logits(model, tokens):
  g, p = nnx.split(model)
  return np.asarray(forward(g, p, tokens).logits)


def test_export_round_trip_loads_in_transformers(tmp_path):
  """jaxpod -> HF layout -> transformers and back: same logits, identical tensors."""
  from transformers import LlamaForCausalLM
  model = init(tiny(rms_norm_eps=1e-5), seed=3)
  hf_io.save(model, str(tmp_path))
  tokens = np.arange(30, dtype=np.int32).reshape(2, 15)
  hf = LlamaForCausalLM.from_pretrained(str(tmp_path)).eval()
  with torch.no_grad():
    want = hf(torch.from_numpy(tokens).long()).logits.numpy()
  np.testing.assert_allclose(_logits(model, tokens), want, atol=1e-5)
  back = hf_io.load(str(tmp_path), _mesh())
  for (p, a), (_, b) in zip(nnx.to_flat_state(nnx.state(model)), nnx.to_flat_state(nnx.state(back))):
    np.testing.assert_array_equal(np.asarray(a.get_value()), np.asarray(b.get_value()), err_msg=str(p))


def test_sharded_index_over_fsspec_memory(hf_gqa):
  """A checkpoint split over two files with an index, read from memory://."""
  from safetensors import safe_open
  from safetensors.numpy import save
  folder, _ = hf_gqa
  with safe_open(f"{folder}/model.safetensors", "numpy") as f:
    tensors = {k: f.get_tensor(k) for k in f.keys()}
  names = sorted(tensors)
  parts = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
  fs = fsspec.filesystem("memory")
  for fname, keys in parts.items():
    fs.pipe(f"/ckpt/{fname}", save({k: tensors[k] for k in keys}))
  fs.pipe("/ckpt/model.safetensors.index.json",
          json.dumps({"weight_map": {k: f for f, ks in parts.items() for k in ks}}).encode())
  fs.pipe("/ckpt/config.json", open(f"{folder}/config.json", "rb").read())
  tokens = np.arange(20, dtype=np.int32).reshape(2, 10)
  np.testing.assert_array_equal(_logits(hf_io.load("memory://ckpt", _mesh()), tokens),
                                _logits(hf_io.load(folder, _mesh()), tokens))


def test_missing_and_mismatched_tensors_are_named(tmp_path):
  from safetensors import safe_open
  from safetensors.numpy import save_file
  hf_io.save(init(tiny()), str(tmp_path))
  with safe_open(f"{tmp_path}/model.safetensors", "numpy") as f:
    tensors = {k: f.get_tensor(k) for k in f.keys()}
  bad = dict(tensors)
  bad["model.layers.1.self_attn.k_proj.weight"] = np.zeros((16, 64), np.float32)
  save_file(bad, f"{tmp_path}/model.safetensors")
  with pytest.raises(ValueError, match=r"model\.layers\.1\.self_attn\.k_proj\.weight.*expected shape \(32, 64\)"
                     r".*found \(16, 64\)"):
    hf_io.load(str(tmp_path), _mesh())
  del bad["model.layers.1.self_attn.k_proj.weight"]
  save_file(bad, f"{tmp_path}/model.safetensors")
  with pytest.raises(ValueError, match=r"lacks tensor.*model\.layers\.1\.self_attn\.k_proj\.weight"):
    hf_io.load(str(tmp_path), _mesh())


def test_bf16_load_and_export(tmp_path, hf_gqa):
  folder, _ = hf_gqa
  model = hf_io.load(folder, _mesh(), dtype="bfloat16")
  assert model.embed_tokens[...].dtype == jax.numpy.bfloat16
  tokens = np.arange(20, dtype=np.int32).reshape(2, 10)
  err = np.max(np.abs(_logits(model, tokens) - _logits(hf_io.load(folder, _mesh()), tokens)))
  assert err < 5e-2, err  # bf16 has 8 mantissa bits; logits are O(1)
  hf_io.save(model, str(tmp_path))
  assert hf_io.load(str(tmp_path), _mesh()).embed_tokens[...].dtype == jax.numpy.bfloat16


def test_tokenizers(tmp_path):
  from tokenizers import Tokenizer, models, pre_tokenizers, trainers, decoders
  assert load_tokenizer(str(tmp_path)).encode("hé")[1:] == list("hé".encode())  # no files: bytes
  bt = ByteTokenizer()
  assert bt.decode(bt.encode("héllo") + [bt.eos_ids[0]]) == "héllo"
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=280, special_tokens=["<s>", "</s>"],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(["hello world"] * 50, trainer)
  tok.save(f"{tmp_path}/tokenizer.json")
  (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
  loaded = load_tokenizer(str(tmp_path))
  assert (loaded.bos_id, loaded.eos_ids) == (0, (1,))
  assert loaded.decode(loaded.encode("hello world")) == "hello world"
  (tmp_path / "tokenizer.json").write_text("{not json")
  with pytest.raises(ValueError, match="tokenizer.json cannot be read"):
    load_tokenizer(str(tmp_path))
