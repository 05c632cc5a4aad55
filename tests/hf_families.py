"""Tiny random HF checkpoints of each decoder family, written by transformers' own config and model classes
(offline), one per family per test session (the `hf_family` fixture in tests/conftest.py).

Every family uses the byte-level tokenizer's ids (vocab 300: bytes, BOS 256, EOS 257, PAD 258), hidden 64,
2 layers, GQA 4/2, and a sliding window of 8 where the family has one, so prompts of the sampling tests
(up to 27 tokens, plus new ones) and the 24-token parity sequences reach past the window."""
from __future__ import annotations

WINDOW = 8
FAMILIES = ("qwen2", "qwen3", "gemma3_text", "mistral")
SLIDING = ("qwen2", "gemma3_text", "mistral")
_BASE = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, bos_token_id=256,
             eos_token_id=257, pad_token_id=258)


def _classes(family: str):
  import transformers as T
  return {
      # Qwen2: q/k/v biases; the second layer slides (use_sliding_window, max_window_layers=1); untied head
      "qwen2": (T.Qwen2Config, T.Qwen2ForCausalLM,
                dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)),
      # Qwen3: q/k norms, head_dim 32 != hidden/heads, tied head, full attention
      "qwen3": (T.Qwen3Config, T.Qwen3ForCausalLM, dict(head_dim=32, tie_word_embeddings=True)),
      # Gemma 3: one local (sliding, RoPE base 1e4) and one global layer (1e6), query_pre_attn_scalar != head_dim
      "gemma3_text": (T.Gemma3TextConfig, T.Gemma3ForCausalLM,
                      dict(head_dim=32, sliding_window=WINDOW, query_pre_attn_scalar=24,
                           layer_types=["sliding_attention", "full_attention"])),
      # Mistral: every layer slides; untied head
      "mistral": (T.MistralConfig, T.MistralForCausalLM, dict(sliding_window=WINDOW)),
  }[family]


def hf_config(family: str):
  """The transformers config object of the family's tiny checkpoint."""
  config_cls, _, extra = _classes(family)
  return config_cls(**_BASE, **extra)


def write_family_checkpoint(folder, family: str, seed: int = 0):
  """Save a random tiny HF model of `family` (fp32) to `folder`; returns the torch model."""
  import torch
  _, model_cls, _ = _classes(family)
  torch.manual_seed(seed)
  model = model_cls(hf_config(family)).eval()
  with torch.no_grad():  # norms and biases start at identity/zero: randomise them so the tests see their weights
    for n, p in model.named_parameters():
      if "norm" in n or n.endswith("bias"):
        p.add_(0.1 * torch.randn_like(p))
  model.save_pretrained(folder)
  return model
