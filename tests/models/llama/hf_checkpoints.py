"""A tiny random HF Llama checkpoint written by `transformers` (offline), for the llama tests."""


def write_hf_checkpoint(folder, seed=0, **overrides):
  """Save a random tiny HF LlamaForCausalLM (fp32) to `folder`; returns the torch model."""
  import torch
  from transformers import LlamaConfig, LlamaForCausalLM
  kw = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            rms_norm_eps=1e-5, bos_token_id=256, eos_token_id=257, pad_token_id=258)
  kw.update(overrides)
  torch.manual_seed(seed)
  model = LlamaForCausalLM(LlamaConfig(**kw)).eval()
  with torch.no_grad():  # norms are ones at init: randomise them so the test sees their weights
    for n, p in model.named_parameters():
      if "norm" in n:
        p.add_(0.1 * torch.randn_like(p))
  model.save_pretrained(folder)
  return model
