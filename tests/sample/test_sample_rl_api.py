"""The RL-facing API of `Sampler`: log-probs, incremental submit/step, weight swaps without recompiling."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxpod.models.llama import init
from jaxpod.runtime import make_mesh
from jaxpod.sample import SamplingParams, token_logprobs

from sample_fixtures import EOS, IDS, SEEDS, STOP, lockstep, same, small_sampler as _sampler, tiny_sample_cfg
from tests.conftest import compiles as compile_log


def _teacher_forced(model, completions, sp):
  """What a trainer recomputes (`token_logprobs`) for each sampled token from one plain forward of prompt + sampled."""
  rows = [IDS[c.request] + list(c.sampled) for c in completions]
  tokens = np.zeros((len(rows), 48), np.int32)  # causal: padding after a row does not change its logits
  for i, r in enumerate(rows):
    tokens[i, :len(r)] = r
  logits = jax.jit(lambda t: model(t).logits)(tokens)
  logp = np.asarray(token_logprobs(logits[:, :-1], jnp.asarray(tokens[:, 1:]), sp))
  return [[logp[i, len(IDS[c.request]) - 1 + t] for t in range(len(c.sampled))] for i, c in enumerate(completions)]


@pytest.mark.parametrize("sp", [SamplingParams(), SamplingParams(temperature=1.0),
                                SamplingParams(temperature=1.0, top_k=5, top_p=0.7)], ids=["greedy", "t1", "filtered"])
def test_logprobs_equal_a_teacher_forced_forward(model, sp):
  """Both engines' log-probs (fp32) are what a trainer recomputes from a plain forward (`token_logprobs`, the
  distribution the token was drawn from: greedy at temperature 1; top-k then top-p, renormalised over the kept
  tokens: each filter alone would keep other tokens here), so an on-policy RL ratio is 1 with filters too."""
  filtered = sp.top_k > 0 or sp.top_p < 1  # the lock-step engine draws with the same sample_tokens: once is enough
  for completions in [_sampler(model, sp).generate(IDS, SEEDS)] + ([] if filtered else [lockstep(model, sp)]):
    want = _teacher_forced(model, completions, sp)
    diff = max(abs(a - b) for c, w in zip(completions, want) for a, b in zip(c.logprobs, w))
    assert diff <= 1e-5, diff
    assert all(len(c.logprobs) == len(c.sampled) == len(c.versions) for c in completions)


def test_submit_step_gives_generate_completions(model):
  """Requests submitted in two parts with a round between them: generate's completions (numbered by submission)."""
  sp = SamplingParams(temperature=0.8, top_k=20, top_p=0.9)
  s = _sampler(model, sp)
  want = s.generate(IDS, SEEDS, n=2)
  first = s.submit(IDS[:3], SEEDS[:3], n=2)
  assert s.pending == 6 and not s.idle
  done = s.step()
  second = s.submit(IDS[3:], SEEDS[3:], n=2)
  assert first == list(range(len(IDS), len(IDS) + 3)) and second == list(range(first[-1] + 1, first[-1] + 5))
  with pytest.raises(RuntimeError, match="needs an idle sampler"):
    s.generate(IDS, SEEDS)
  while not s.idle:
    done += s.step()
  assert s.pending == 0 and len(done) == len(want)
  got = sorted((c._replace(request=c.request - first[0]) for c in done), key=lambda c: (c.request, c.sample))
  same(got, want)


def test_update_params_between_steps(model):
  """New weights between rounds: no compilation; sequences in flight go on, their later tokens carry the new
  version and differ from the old weights'; a different layout is refused in one line naming the leaf."""
  s = _sampler(model, max_new_tokens=10, steps_per_round=3)
  s.warmup()
  long = [i for i, c in enumerate(s.generate(IDS, SEEDS)) if len(c.sampled) >= 6][:2]  # still running after round 1
  ids, seeds = [IDS[i] for i in long], [SEEDS[i] for i in long]
  old_run = s.generate(ids, seeds)
  _, params = nnx.split(model)
  other = nnx.split(init(tiny_sample_cfg(), seed=8))[1]
  other = jax.tree.map(lambda new, old: jax.device_put(new, old.sharding), other, params)
  compiles = compile_log()
  s.submit(ids, seeds)
  assert s.step() == [] and s.version == 0  # prefill (1 token) + 3 decode steps under version 0
  s.update_params(other, version=1)
  assert s.version == 1
  done = []
  while not s.idle:
    done += s.step()
  assert compiles == [], compiles
  done.sort(key=lambda c: c.request)
  for new, old in zip(done, old_run):
    assert new.versions == (0,) * 4 + (1,) * (len(new.sampled) - 4)
    assert new.sampled[:4] == old.sampled[:4] and new.logprobs[:4] == old.logprobs[:4]
    assert new.logprobs[4] != pytest.approx(old.logprobs[4], abs=1e-4)  # the new weights made token 4
  leaf = lambda tree, f: jax.tree.map_with_path(  # noqa: E731
      lambda p, x: f(x) if jax.tree_util.keystr(p, simple=True, separator=".") == "norm.value" else x, tree)
  two = jax.sharding.NamedSharding(make_mesh(devices=jax.devices()[:2]), jax.sharding.PartitionSpec())
  for bad, match in ((leaf(params, lambda x: x.astype(jnp.bfloat16)), r"norm.value has dtype bfloat16, expected "
                                                                       r"float32"),
                     (leaf(params, lambda x: x[:-1]), r"norm.value has shape \(63,\), expected \(64,\)"),
                     (leaf(params, lambda x: jax.device_put(x, two)), r"norm.value has sharding NamedSharding"),
                     ({"norm": params["norm"]}, r"parameter tree differs")):
    with pytest.raises(ValueError, match=match) as e:
      s.update_params(bad, version=2)
    assert "\n" not in str(e.value) and s.version == 1
