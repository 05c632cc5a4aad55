"""A tiny random Llama saved in HF layout by jaxpod itself (byte-level tokenizer: no tokenizer files)."""
import pytest

from jaxpod.models.llama import hf_io, init, tiny

EOS = 257  # ByteTokenizer: BOS 256, EOS 257, PAD 258
STOP = 80  # a token this random model often emits: with it as a stop id, some rows stop early
PROMPTS = ["a", "hello world", "The quick brown fox", "jax", "multi-host sampling is fun", "xyz 123", "pod"]


def tiny_sample_cfg(**kw):
  return tiny(rms_norm_eps=1e-5, bos_token_id=256, eos_token_id=(EOS,), pad_token_id=258, **kw)


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
  """Folder of a random tiny Llama (GQA 4/2, untied) in HF layout."""
  folder = tmp_path_factory.mktemp("tiny_llama")
  hf_io.save(init(tiny_sample_cfg(), seed=7), str(folder))
  return str(folder)
