"""Tiny random HF Llama checkpoints and prompt files for the extraction tests (offline)."""
from pathlib import Path

import pytest

PROMPTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello",
    "Activation extraction across many hosts must give every sample exactly once.",
    "a",
    "Sparse autoencoders are trained on residual stream activations of language models, layer by layer.",
    "Preemptible pods restart at any time; resume must be global.",
    "ok",
    "0123456789" * 3,
    "Ünïcödé bytes count as several tokens in a byte-level tokenizer.",
    "short one",
    "The leader tokenizes; every host runs the same forward.",
    "x y z",
    "Replica zero only, placed by global index, never by arrival order.",
    "Mesh axes: data, fsdp, model.",
    "The last batch is partial.",
    "What is written is what is read.",
    "Byte identical on one host or eight devices.",
    "end",
    "Twenty prompts minus one.",
    "Nineteen prompts and a half.",
    "Twenty-one.",
]


def write_checkpoint(folder, seed: int = 0, **overrides):
  """Save a random tiny HF LlamaForCausalLM (fp32, hidden 64) to `folder`; returns the torch model."""
  import torch
  from transformers import LlamaConfig, LlamaForCausalLM
  kw = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, bos_token_id=256,
            eos_token_id=257, pad_token_id=258)
  kw.update(overrides)
  torch.manual_seed(seed)
  model = LlamaForCausalLM(LlamaConfig(**kw)).eval()
  with torch.no_grad():  # norms are ones at init: randomise them so their weights matter
    for n, p in model.named_parameters():
      if "norm" in n:
        p.add_(0.1 * torch.randn_like(p))
  model.save_pretrained(folder)
  return model


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
  """(checkpoint folder, torch model, prompts file): 3 blocks, GQA 4/2, byte-level tokenizer."""
  root = tmp_path_factory.mktemp("extract_ckpt")
  model = write_checkpoint(root / "model")
  prompts = root / "prompts.txt"
  prompts.write_text("\n".join(PROMPTS) + "\n")
  return str(root / "model"), model, str(prompts)


BASELINE_URL = "memory://extract-tests/baseline"
BUDGET = 580_000  # extract.device_memory_bytes: less than the test model's whole weights (597,760 bytes in float32)
BASE_OPTIONS = dict(layers=(0, 2), points=("resid", "attn_out", "mlp_out"), max_seq_len=48, progress=False)


@pytest.fixture(scope="session")
def baseline(tiny_ckpt):
  """The reference dataset: the exact forward, one process, 8 devices (data=8), batch 8, written to memory://."""
  from jaxpod import extract
  model, _, prompts = tiny_ckpt
  cfg = extract.ExtractConfig(hf=model, prompts=prompts, out=BASELINE_URL, batch_size=8, forward="exact",
                              **BASE_OPTIONS)
  stats = extract.run(cfg)
  assert stats["rows"] == len(PROMPTS)
  return extract.open(BASELINE_URL)


def assert_close_dataset(a, b, rtol: float):
  """Same keys, rows, tokens and mask; every array within max|a - b| <= rtol * max|b| (sharded.TOLERANCE)."""
  assert a.keys == b.keys and a.num_rows == b.num_rows
  assert a.tokens.tobytes() == b.tokens.tobytes() and (a.mask == b.mask).all()
  for k in a.keys:
    x, y = a[k].astype("f4")[a.mask], b[k].astype("f4")[b.mask]
    assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
    assert abs(x - y).max() <= rtol * abs(y).max(), f"{k}: max abs diff {abs(x - y).max()} vs max {abs(y).max()}"


def hf_captures(hf_model, ids):
  """resid/attn_out/mlp_out per block from torch hooks, plus HF's hidden_states, for one prompt."""
  import torch
  got = {}
  hooks = []
  for i, layer in enumerate(hf_model.model.layers):
    hooks.append(layer.register_forward_hook(
        lambda m, a, o, i=i: got.__setitem__(f"resid.{i}", o[0] if isinstance(o, tuple) else o)))
    hooks.append(layer.self_attn.register_forward_hook(lambda m, a, o, i=i: got.__setitem__(f"attn_out.{i}", o[0])))
    hooks.append(layer.mlp.register_forward_hook(lambda m, a, o, i=i: got.__setitem__(f"mlp_out.{i}", o)))
  with torch.no_grad():
    hs = hf_model(torch.tensor([ids]), output_hidden_states=True).hidden_states
  for h in hooks:
    h.remove()
  return {k: v[0].float().numpy() for k, v in got.items()}, [h[0].float().numpy() for h in hs]


def assert_same_dataset(a, b):
  """Byte-identical arrays for every key, and the same tokens and mask."""
  assert a.keys == b.keys and a.num_rows == b.num_rows
  for k in a.keys:
    x, y = a[k], b[k]
    assert x.dtype == y.dtype and x.shape == y.shape, k
    assert x.tobytes() == y.tobytes(), f"{k}: max abs diff {abs(x.astype('f4') - y.astype('f4')).max()}"
  assert a.tokens.tobytes() == b.tokens.tobytes() and (a.mask == b.mask).all()
