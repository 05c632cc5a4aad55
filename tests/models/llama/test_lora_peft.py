"""PEFT parity both ways in fp32 for Llama, Qwen3 and Gemma 3 (tiny transformers checkpoints, random nonzero
adapters): an adapter jaxpod saves loads in `peft` onto the transformers model with the same logits, and one
`peft` saves loads in jaxpod with the same logits (tolerance 1e-5 as test_families.py)."""
import numpy as np
import pytest
import torch

from jaxpod.models.llama import hf_io, lora, peft_io
from tests.models.llama.test_families import TOL, _hf_logits, _logits, _mesh, _tokens
from tests.models.llama.test_lora import _randomize

PARITY = ("llama", "qwen3", "gemma3_text")


def _base(request, family):
  """(folder, fresh transformers model): a fresh copy, since peft injects its layers into the model it wraps."""
  from transformers import AutoModelForCausalLM
  folder = request.getfixturevalue("hf_gqa")[0] if family == "llama" else request.getfixturevalue("hf_family")(
      family)[0]
  return folder, AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


@pytest.mark.parametrize("family", PARITY)
def test_jaxpod_adapter_loads_in_peft(request, family, tmp_path):
  """jaxpod attaches rank-4 adapters (alpha 8, all seven projections), randomises them, saves PEFT's files;
  `PeftModel.from_pretrained` on the transformers base gives jaxpod's logits."""
  from peft import PeftModel
  folder, hf_base = _base(request, family)
  model = _randomize(lora.attach(hf_io.load(folder, _mesh()), lora.LoraConfig(rank=4, alpha=8)))
  peft_io.save_adapter(model, str(tmp_path), base_model=folder)
  peft_model = PeftModel.from_pretrained(hf_base, str(tmp_path)).eval()
  tokens = _tokens(seed=5)
  want = _hf_logits(peft_model, tokens)
  err = float(np.max(np.abs(_logits(model, tokens) - want)))
  print(f"{family} jaxpod -> peft: max abs logits diff {err:.1e}")
  assert err < TOL
  assert float(np.max(np.abs(_logits(hf_io.load(folder, _mesh()), tokens) - want))) > 100 * TOL  # adapters count


@pytest.mark.parametrize("family", PARITY)
def test_peft_adapter_loads_in_jaxpod(request, family, tmp_path):
  """`peft.get_peft_model` (rank 4, alpha 6, rsLoRA, attention and MLP minus k_proj) with lora_B randomised,
  `save_pretrained`; jaxpod loads it onto its base with peft's logits."""
  from peft import LoraConfig, get_peft_model
  folder, hf_base = _base(request, family)
  targets = ["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
  torch.manual_seed(7)
  peft_model = get_peft_model(hf_base, LoraConfig(r=4, lora_alpha=6, use_rslora=True, target_modules=targets))
  with torch.no_grad():
    for n, p in peft_model.named_parameters():
      if "lora_B" in n:
        p.normal_(0, 0.05)
  peft_model.save_pretrained(str(tmp_path))
  model = peft_io.load_adapter(hf_io.load(folder, _mesh()), str(tmp_path))
  assert lora.lora_config(model) == lora.LoraConfig(rank=4, alpha=6, rslora=True, target_modules=tuple(targets))
  tokens = _tokens(seed=6)
  err = float(np.max(np.abs(_logits(model, tokens) - _hf_logits(peft_model.eval(), tokens))))
  print(f"{family} peft -> jaxpod: max abs logits diff {err:.1e}")
  assert err < TOL
