"""The continuous engine (both KV layouts) against the lock-step one and HF: same tokens, n samples sharing a
prefill, KV capacity buckets, pages freed, preemption, bad input."""
import jax
import pytest

from jaxpod.sample import EngineConfig, SamplingParams

from sample_fixtures import EOS, IDS, SEEDS, STOP, SMALL, lockstep, same, small_sampler as _sampler

SAMPLED = SamplingParams(temperature=0.8, top_k=20, top_p=0.9)


def _check_layout_books(s, layout):
  assert s.last.rounds > 10 // SMALL["steps_per_round"] + 1  # more rounds than one chunk: slots were refilled
  if layout == "paged":
    assert s.last.pool.free == s.ec.pool_pages - 1  # every page back in the pool
    assert s.last.pool.peak_used < s.ec.pool_pages - 1  # memory followed lengths, not the static layout
  else:
    assert len(set(s.last.capacities)) > 1 and s.runner.resizes > 1  # the KV capacity followed the longest row


def test_greedy_identical_across_slots_paged_lockstep_and_hf(model, tiny_ckpt):
  """Token identity (fp32, greedy): ragged prompts through 2 slots in both KV layouts give the lock-step
  engine's tokens and HF generate's (each prompt alone), with both finish reasons exercised."""
  import torch
  from transformers import LlamaForCausalLM
  hf = LlamaForCausalLM.from_pretrained(tiny_ckpt, dtype=torch.float32).eval()
  want = []
  for row in IDS:
    with torch.no_grad():
      out = hf.generate(torch.tensor([row]), max_new_tokens=10, do_sample=False, eos_token_id=[EOS, STOP],
                        pad_token_id=258, attention_mask=torch.ones(1, len(row), dtype=torch.long))
    want.append(tuple(out[0, len(row):].tolist()))
  locked = lockstep(model, SamplingParams())
  assert [c.sampled for c in locked] == want
  assert {"stop", "length"} <= {c.finish_reason for c in locked}
  for layout in ("slots", "paged"):
    s = _sampler(model, kv_layout=layout)
    same(s.generate(IDS, SEEDS), locked)
    _check_layout_books(s, layout)


@pytest.mark.parametrize("layout", ["slots", "paged"])
def test_seeded_identical_to_lockstep(model, layout):
  """Temperature, top-k and top-p with per-request seeds: the lock-step engine's tokens in both layouts."""
  s = _sampler(model, SAMPLED, kv_layout=layout)
  same(s.generate(IDS, SEEDS), lockstep(model, SAMPLED))
  _check_layout_books(s, layout)


@pytest.mark.parametrize("layout", ["slots", "paged"])
def test_n_samples_share_the_prefill(model, layout):
  """Sample 0 of n is the n=1 completion; greedy samples agree; seeded ones differ; a prompt is prefilled once
  per group, also when a slot frees for one of its samples only (slots: the other waits parked with the
  prefill's output; paged: in the ready queue, holding the prompt's shared full pages once)."""
  s = _sampler(model, kv_layout=layout)
  greedy = s.generate(IDS, SEEDS, n=2)
  same([greedy[2 * i] for i in range(len(IDS))], lockstep(model, SamplingParams()))
  assert all(greedy[2 * i].sampled == greedy[2 * i + 1].sampled for i in range(len(IDS)))
  assert [c.sample for c in greedy[:2]] == [0, 1] and [c.request for c in greedy[-2:]] == [len(IDS) - 1] * 2
  prompt_tokens = sum(len(x) for x in IDS)
  assert s.last.prefill_prompt_tokens == prompt_tokens and s.last.sample_prompt_tokens == 2 * prompt_tokens
  s = _sampler(model, SAMPLED, kv_layout=layout)  # 2 slots: request 0 takes one, request 1's two samples
  s.submit([IDS[4]], [SEEDS[4]], n=1)              # share one prefill, one of them waiting for the second slot
  s.submit([IDS[2]], [SEEDS[2]], n=2)
  done = []
  while not s.idle:
    done += s.step()
  got = sorted(done, key=lambda c: (c.request, c.sample))
  ref = lockstep(model, SAMPLED)
  same([got[0], got[1]], [ref[4]._replace(request=got[0].request), ref[2]._replace(request=got[1].request)])
  assert got[1].sampled != got[2].sampled
  assert s.last.prefill_prompt_tokens == len(IDS[4]) + len(IDS[2])
  if layout == "slots":
    assert s.last.parked_most == 1
  else:
    got = s.generate([IDS[4]], [SEEDS[4]], n=2)  # 26 tokens: 6 full pages shared, 1 partial page each
    full = len(IDS[4]) // 4  # 6 prompt pages, shared; each sample's positions reach 26 + 10 - 2 = 34: page 8
    assert s.last.pool.peak_used <= full + 2 * (9 - full) < 2 * 9  # prompt pages held once, not twice


def test_decode_computes_the_row_class_of_its_live_slots_with_the_same_tokens(model):
  """Slots: a round computes the smallest of 8, 4, 2 slots that holds every live one (free slots are handed out
  lowest first), so the tail of a batch costs its live rows, not the slot count; the tokens are the lock-step
  engine's, as when every round computes all 8 (decode_row_classes=1)."""
  ref = lockstep(model, SAMPLED)
  s = _sampler(model, SAMPLED, batch_size=8, prefill_batch=8)
  same(s.generate(IDS, SEEDS), ref)
  counts = s.last.row_counts
  assert counts[0] == 8 and set(counts) <= {2, 4, 8}, counts  # 7 live slots: all 8 at first
  s = _sampler(model, SAMPLED, batch_size=8, prefill_batch=8)
  same(s.generate(IDS[:3], SEEDS[:3]), ref[:3])
  assert set(s.last.row_counts) <= {2, 4}, s.last.row_counts  # 3 prompts in 8 slots: never all 8
  s = _sampler(model, SAMPLED, batch_size=8, prefill_batch=8, decode_row_classes=1)
  same(s.generate(IDS, SEEDS), ref)
  assert set(s.last.row_counts) == {8}


def test_row_classes_split_like_the_slots_over_data_shards(model, tiny_ckpt):
  """Two data shards of 4 slots each: new sequences alternate between the shards, so 3 live sequences compute
  2 slots of each shard (4 in all, not 8), and the tokens stay the lock-step engine's."""
  from jaxpod.models.llama import hf_io
  from jaxpod.runtime.mesh import make_mesh
  from jaxpod.sample import Sampler
  mesh = make_mesh(data=2, devices=jax.devices()[:2])
  s = Sampler(hf_io.load(tiny_ckpt, mesh), mesh,
              EngineConfig(**(SMALL | dict(batch_size=8, prefill_batch=8))), SAMPLED, [EOS, STOP])
  assert s.runner.shards == 2
  same(s.generate(IDS[:3], SEEDS[:3]), lockstep(model, SAMPLED)[:3])
  assert s.last.row_counts[0] == 4 and set(s.last.row_counts) <= {2, 4}, s.last.row_counts


def test_small_pool_preempts_and_restarts_to_the_same_tokens(model):
  """A pool that holds one full sequence and a bit: sequences are preempted and restarted, same output."""
  s = _sampler(model, SAMPLED, kv_layout="paged", batch_size=4, prefill_batch=4, num_pages=12)
  same(s.generate(IDS, SEEDS), lockstep(model, SAMPLED))
  assert s.last.preemptions > 0 and s.last.pool.free == 11


def test_bad_requests_one_clear_line(model):
  s = _sampler(model)
  for ids, match in (([[5] * 33], r"prompt 0 has 33 tokens > sample.max_prompt_len=32; raise"),
                     ([[5], []], r"prompt 1 is empty")):
    with pytest.raises(ValueError, match=match) as e:
      s.generate(ids, [0] * len(ids))
    assert "\n" not in str(e.value)
  with pytest.raises(ValueError, match=r"sample.decode_row_classes=0 must be >= 1"):
    EngineConfig(**(SMALL | dict(decode_row_classes=0)))
  with pytest.raises(ValueError, match=r"sample.kv_layout='rows'; use one of \('slots', 'paged'\)"):
    EngineConfig(**(SMALL | dict(kv_layout="rows")))
  with pytest.raises(ValueError, match=r"sample.num_pages=10 is too small for one sequence: .* 42 tokens need "
                                       r"11 pages of page_size=4 .* set num_pages >= 12") as e:
    EngineConfig(**(SMALL | dict(num_pages=10)))
  assert "\n" not in str(e.value)
