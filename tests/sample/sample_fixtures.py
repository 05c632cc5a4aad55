"""Constants and config of the tiny sampling test model (byte-level tokenizer ids)."""
from jaxpod.models.llama import tiny

EOS = 257  # ByteTokenizer: BOS 256, EOS 257, PAD 258
STOP = 80  # a token this random model often emits: with it as a stop id, some rows stop early
PROMPTS = ["a", "hello world", "The quick brown fox", "jax", "multi-host sampling is fun", "xyz 123", "pod"]


def tiny_sample_cfg(**kw):
  return tiny(rms_norm_eps=1e-5, bos_token_id=256, eos_token_id=(EOS,), pad_token_id=258, **kw)
