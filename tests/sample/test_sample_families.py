"""Every decoder family through both engines and both KV layouts (sliding windows included: the prompts and
completions reach past the window of 8): greedy tokens equal HF generate's, and the log-probs the engines return
equal a teacher-forced forward. One engine run per family serves both tests."""
import jax
import numpy as np
import pytest
import torch

from jaxpod.models.llama import hf_io
from jaxpod.runtime import make_mesh
from jaxpod.sample import EngineConfig, Sampler, SamplingParams
from tests.hf_families import FAMILIES, WINDOW

from sample_fixtures import EOS, IDS, SEEDS, STOP, lockstep, same

NEW = 10
# every prompt in one prefill and one decode capacity: few programs to compile (requests joining mid-stream are
# test_sample_continuous.py's subject; here it is each family's attention in each KV layout)
ONE_ROUND = dict(batch_size=8, max_prompt_len=32, max_new_tokens=NEW, page_size=16, steps_per_round=NEW,
                 prefill_batch=8, min_prefill_len=32)
assert max(map(len, IDS)) + NEW > 2 * WINDOW


@pytest.fixture(scope="module")
def runs(hf_family):
  """runs(family) -> (model, hf_model, {"hf", "lockstep", "slots", "paged"}: completions of IDS), made once."""
  made = {}

  def get(family):
    if family not in made:
      folder, hf_model = hf_family(family)
      model = hf_io.load(folder, make_mesh(devices=jax.devices()[:1]))
      out = {"lockstep": lockstep(model, SamplingParams(), new=NEW)}
      for layout in ("slots", "paged"):
        out[layout] = Sampler(model, make_mesh(devices=jax.devices()[:1]), EngineConfig(**ONE_ROUND, kv_layout=layout),
                              SamplingParams(), [EOS, STOP]).generate(IDS, SEEDS)
      out["hf"] = [_hf_greedy(hf_model, row) for row in IDS]
      made[family] = model, out
    return made[family]
  return get


def _hf_greedy(hf_model, row):
  with torch.no_grad():
    out = hf_model.generate(torch.tensor([row]), max_new_tokens=NEW, do_sample=False, eos_token_id=[EOS, STOP],
                            pad_token_id=258, attention_mask=torch.ones(1, len(row), dtype=torch.long))
  return tuple(out[0, len(row):].tolist())


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_tokens_equal_hf_generate_in_every_engine(runs, family):
  """Token identity (fp32, greedy): HF generate of each prompt alone = lock-step engine = continuous engine in
  both KV layouts (sliding layers keep every key and mask those past the window)."""
  _, out = runs(family)
  assert [c.sampled for c in out["lockstep"]] == out["hf"]
  for layout in ("slots", "paged"):
    same(out[layout], out["lockstep"])


@pytest.mark.parametrize("family", FAMILIES)
def test_engine_logprobs_equal_a_teacher_forced_forward(runs, family):
  """The log-probs of every engine are log softmax of one plain forward over prompt + sampled tokens."""
  model, out = runs(family)
  completions = out["lockstep"]
  rows = [IDS[c.request] + list(c.sampled) for c in completions]
  tokens = np.zeros((len(rows), 48), np.int32)  # causal: padding after a row does not change its logits
  for i, r in enumerate(rows):
    tokens[i, :len(r)] = r
  logp = np.asarray(jax.nn.log_softmax(jax.jit(lambda t: model(t).logits)(tokens), axis=-1))
  for engine in ("lockstep", "slots", "paged"):
    got = [lp for c in out[engine] for lp in c.logprobs]
    want = [logp[c.request, len(IDS[c.request]) - 1 + t, tok] for c in out[engine] for t, tok in enumerate(c.sampled)]
    assert np.max(np.abs(np.asarray(got) - np.asarray(want))) <= 1e-5, engine
