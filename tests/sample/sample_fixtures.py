"""Constants and config of the tiny sampling test model (byte-level tokenizer ids), and the lock-step reference."""
import jax
import numpy as np
from flax import nnx

from jaxpod.models.llama import ByteTokenizer, stack, tiny
from jaxpod.runtime import make_mesh
from jaxpod.sample import EngineConfig, Sampler, SamplingParams, lockstep as lockstep_engine

EOS = 257  # ByteTokenizer: BOS 256, EOS 257, PAD 258
STOP = 80  # a token this random model often emits: with it as a stop id, some rows stop early
PROMPTS = ["a", "hello world", "The quick brown fox", "jax", "multi-host sampling is fun", "xyz 123", "pod"]
IDS = [ByteTokenizer().encode(p) for p in PROMPTS]
SEEDS = list(range(100, 100 + len(IDS)))
# 2 slots, 2-row prefill, 4-token pages, 3 steps per round: requests join and leave mid-stream
SMALL = dict(batch_size=2, max_prompt_len=32, max_new_tokens=10, page_size=4, steps_per_round=3, prefill_batch=2,
             min_prefill_len=16)


def tiny_sample_cfg(**kw):
  return tiny(rms_norm_eps=1e-5, bos_token_id=256, eos_token_id=(EOS,), pad_token_id=258, **kw)


def lockstep(model, sp, new=10):
  """The lock-step engine's completions of IDS (seeds SEEDS), all prompts in one chunk of 8 rows."""
  graphdef, params = nnx.split(stack.unstacked(model))  # the engine's form: a block per layer
  ec = EngineConfig(batch_size=8, max_prompt_len=32, max_new_tokens=new)
  tokens, lengths, seeds = np.zeros((8, 32), np.int32), np.ones((8,), np.int32), np.zeros((8,), np.uint32)
  for i, row in enumerate(IDS):
    tokens[i, :len(row)], lengths[i], seeds[i] = row, len(row), SEEDS[i]
  out, logp = lockstep_engine.compiled_generate(ec, sp, (EOS, STOP))(graphdef, params, tokens, lengths, seeds)
  out, logp = np.asarray(out), np.asarray(logp)
  return [lockstep_engine.completion(out[i], logp[i], (EOS, STOP), 0, i) for i in range(len(IDS))]


def same(got, want, atol=1e-5):
  """Same tokens, reasons, versions and numbering; log-probs equal to float32 rounding."""
  assert [c._replace(logprobs=()) for c in got] == [c._replace(logprobs=()) for c in want]
  for a, b in zip(got, want):
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=atol)


def small_sampler(model, sp=SamplingParams(), **kw):
  """A one-device Sampler of the SMALL engine (fields overridden by kw) stopping at EOS and STOP."""
  return Sampler(model, make_mesh(devices=jax.devices()[:1]), EngineConfig(**(SMALL | kw)), sp, [EOS, STOP])
