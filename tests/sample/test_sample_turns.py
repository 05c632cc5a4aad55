"""Kept sequences: a finished sample's KV stays in its slot or pages, and a request extending its tokens (an
episode's next turn) prefills only what was appended, on the same tokens as prefilling it whole."""
import pytest
from flax import nnx

from jaxpod.models.llama import Llama
from jaxpod.sample import SamplingParams
from tests.sample.sample_fixtures import IDS, small_sampler, tiny_sample_cfg

OBS = [[111, 112], [114]]  # what the "environment" appends after each turn
SHAPES = dict(max_prompt_len=16, max_new_tokens=3)  # every context fits one prefill bucket (as in tests/rl)


def _turns(model, layout: str, keep: bool):
  """Two turns of one prompt's 2 samples (a weights swap, same values, before the second): per turn the
  completions and the scheduler's (prefill tokens, continued sequences)."""
  s = small_sampler(model, SamplingParams(temperature=1.0), kv_layout=layout, **SHAPES)
  params = nnx.split(model)[1]
  out = s.generate([IDS[0]], [3], n=2, keep=keep)
  turns, counts = [out], [(s.last.prefill_prompt_tokens, s.last.extended)]
  contexts = [IDS[0] + list(c.sampled) for c in out]
  for t in (1,):
    s.update_params(params, version=t)
    contexts = [c + OBS[j] for j, c in enumerate(contexts)]
    out = s.generate(contexts, [10 * t, 10 * t + 1], keep=keep)
    turns.append(out)
    counts.append((s.last.prefill_prompt_tokens, s.last.extended))
    contexts = [c + list(o.sampled) for c, o in zip(contexts, out)]
  return turns, counts, s


@pytest.mark.parametrize("layout", ["slots", "paged"])
def test_a_kept_sequence_continues_after_appended_tokens_as_a_whole_prefill_would(layout):
  """Invariant 9 across turns: each turn's tokens carry the version that made them, the earlier turns' KV is kept
  across the swap; only the last sampled token and the appended ones are prefilled, with the same tokens as a
  whole prefill of the context (fp32: log-probs to rounding)."""
  import numpy as np
  model = Llama(tiny_sample_cfg(), rngs=nnx.Rngs(params=0))
  kept, kept_counts, s = _turns(model, layout, keep=True)
  whole, whole_counts, _ = _turns(model, layout, keep=False)
  for a, b in zip(kept, whole):
    assert [(c.sampled, c.versions, c.finish_reason) for c in a] == [(c.sampled, c.versions, c.finish_reason)
                                                                     for c in b]
    for x, y in zip(a, b):
      np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-5)
  assert [set(c.versions) for t, out in enumerate(kept) for c in out] == [{t} for t in range(2) for _ in range(2)]
  plen = len(IDS[0])
  assert kept_counts[0] == whole_counts[0] == (plen, 0)  # the prompt once for its 2 samples
  assert [x for _, x in whole_counts] == [0, 0]
  assert kept_counts[1] == (sum(len(o) + 1 for o in OBS), 2)  # the last sampled token + the observation each
  assert whole_counts[1][0] == sum(plen + len(c.sampled) + len(o) for c, o in zip(kept[0], OBS))
  assert s.kept == 2 and s.drop_kept() == 2 and s.kept == 0


@pytest.mark.parametrize("layout", ["slots", "paged"])
def test_warmup_for_episodes_compiles_the_continuations_too(layout):
  """`warmup(keep=True)` compiles the programs that continue a kept sequence too (extend_slots / extend_paged at
  every chunk bucket and KV size a turn can meet): a two-turn episode after it, across a weights swap, compiles
  nothing (a plain warmup left extend to the episode's second turn)."""
  from tests.conftest import compiles as compile_log
  model = Llama(tiny_sample_cfg(), rngs=nnx.Rngs(params=0))
  s = small_sampler(model, SamplingParams(temperature=1.0), kv_layout=layout, **SHAPES)
  s.warmup(keep=True)
  compiles = compile_log()
  out = s.generate([IDS[0]], [3], n=2, keep=True)
  s.update_params(nnx.split(model)[1], version=1)
  s.generate([IDS[0] + list(c.sampled) + OBS[j] for j, c in enumerate(out)], [10, 11], keep=True)
  assert s.last.extended == 2 and compiles == [], compiles
