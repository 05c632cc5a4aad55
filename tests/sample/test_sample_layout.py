"""The engine decodes in its inference layout (DESIGN.md invariant 10: every host moves only its share): a sampler
built from the trainer's FSDP layout reshards once per weight version, and its compiled decode round all-gathers
<= 1% of the parameter bytes per decode step (read from the optimized HLO), with tokens unchanged."""
import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from jaxpod.models.llama import hf_io, init, tiny
from jaxpod.models.llama.model import abstract
from jaxpod.runtime import make_mesh
from jaxpod.runtime.sharding import INFERENCE, state_shardings
from jaxpod.sample import EngineConfig, Sampler, SamplingParams
from jaxpod.sample.layout import collective_bytes, inference_shardings, param_bytes
from jaxpod.sample.memory import kv_cache_bytes

from sample_fixtures import EOS, IDS, SEEDS, SMALL, STOP, same, small_sampler

STEPS = 4


def _decode_hlo(sampler: Sampler) -> str:
  """The optimized HLO of one decode round (only that program is compiled)."""
  r, ec = sampler.runner, sampler.ec
  r.hlo = []
  z = np.zeros((ec.batch_size,), np.int32)
  rows = (z, z, z, z, z.astype(np.uint32), z, z.astype(bool))
  if ec.kv_layout == "paged":
    r.decode(np.zeros((ec.batch_size, ec.pages_per_seq), np.int32), *rows, ec.page_size)
  else:
    r.decode(*rows)
  r.hlo, (text,) = None, r.hlo
  return text


def _fsdp_sampler(cfg, layout: str, fsdp: int = 4, model: int = 1):
  """A sampler built from a model laid out as a trainer lays it out (FSDP over `fsdp` devices)."""
  mesh = make_mesh(data=1, fsdp=fsdp, model=model, devices=jax.devices()[:fsdp * model])
  _, abs_state = nnx.split(abstract(cfg))
  m = init(cfg, seed=0, shardings=state_shardings(abs_state, mesh))
  ec = EngineConfig(batch_size=8, max_prompt_len=16, max_new_tokens=16, page_size=4, steps_per_round=STEPS,
                    kv_layout=layout)
  return Sampler(m, mesh, ec, SamplingParams(), [EOS]), param_bytes(nnx.split(m)[1])


@pytest.mark.slow
def test_decode_gathers_no_weights_from_the_trainer_layout():
  """fsdp=4 (and fsdp=2 x model=2, the vocab-sharded embedding): all-gather bytes of the compiled decode round,
  each counted as often as it runs (outside the step loop: once per call, inside: once per step), are <= 1% of
  the parameter bytes even if the round runs a single step; the weights sit in the inference layout."""
  cfg = tiny(vocab_size=2048, hidden_size=128, intermediate_size=256, dtype="float32")
  for layout, fsdp, model in (("paged", 4, 1), ("slots", 4, 1), ("paged", 2, 2)):
    sampler, pbytes = _fsdp_sampler(cfg, layout, fsdp, model)
    params = sampler.runner.params
    for x, want in zip(jax.tree.leaves(params), jax.tree.leaves(inference_shardings(params, sampler.mesh))):
      assert x.sharding.is_equivalent_to(want, x.ndim)
    got = collective_bytes(_decode_hlo(sampler), STEPS)
    per_step = got["once"] + got["per_trip"]  # a round of one step: everything hoisted counts in full
    assert per_step <= 0.01 * pbytes, (layout, fsdp, model, got, pbytes)


def test_collective_bytes_counts_loop_bodies_per_trip():
  """An all-gather outside the loop counts once per call, one in the loop body once per trip."""
  hlo = """HloModule m

%body (p: (s32[], f32[4])) -> (s32[], f32[4]) {
  %a = f32[8]{0} all-gather(f32[2]{0} %x), dimensions={0}
}

%cond (p: (s32[], f32[4])) -> pred[] {
  %c = pred[] compare(s32[] %i, s32[] %n), direction=LT
}

ENTRY %main (x: f32[16]) -> f32[16] {
  %g = bf16[16,4]{1,0} all-gather(bf16[4,4]{1,0} %x), dimensions={0}
  %w = (s32[], f32[4]) while((s32[], f32[4]) %t), condition=%cond, body=%body
}
"""
  assert collective_bytes(hlo, trips=5) == {"once": 128, "per_trip": 32, "per_call": 128 + 5 * 32}


@pytest.mark.slow
def test_trainer_layout_and_sharded_pool_sample_the_same_tokens(model, tiny_ckpt):
  """data=2 x fsdp=2, weights loaded in the trainer's layout (FSDP): the engine holds them in the inference layout
  (a second engine over them shares that copy), the paged pool is [L, 4, P, ...] with one data shard per device (a
  quarter of the one-device pool, as `kv_cache_bytes` predicts); a pool of one sequence per shard preempts, n=2
  samples share prompt pages within their shard; the tokens equal the one-device engine's (fp32), and so do those
  of a new version given in the trainer's layout (resharded once, at `update_params`)."""
  sp = SamplingParams(temperature=0.8, top_k=20, top_p=0.9)
  want = small_sampler(model, sp, kv_layout="paged").generate(IDS, SEEDS, n=2)
  mesh = make_mesh(data=2, fsdp=2, devices=jax.devices()[:4])
  ec = EngineConfig(**(SMALL | dict(kv_layout="paged", batch_size=8, prefill_batch=4, num_pages=4 * 12)))
  trained = hf_io.load(tiny_ckpt, mesh)
  s = Sampler(trained, mesh, ec, sp, [EOS, STOP])
  same(s.generate(IDS, SEEDS, n=2), want)
  assert s.last.preemptions > 0 and s.last.pool.free == 4 * 11
  cfg = model.cfg
  assert s.runner.k.shape == (cfg.num_hidden_layers, 4, 12, 4, cfg.num_key_value_heads, cfg.head_dim_)
  shard = s.runner.k.addressable_shards[0].data
  assert shard.shape == (cfg.num_hidden_layers, 1, 12, 4, cfg.num_key_value_heads, cfg.head_dim_)
  one = make_mesh(devices=jax.devices()[:1])
  assert 2 * shard.nbytes == kv_cache_bytes(cfg, ec, mesh) == kv_cache_bytes(cfg, ec, one) // 4
  trainer = nnx.split(trained)[1]
  embed = s.runner.params["embed_tokens"].get_value()
  assert embed.sharding.is_equivalent_to(INFERENCE.sharding(mesh, ("vocab", "embed")), 2)  # whole over fsdp
  assert not trainer["embed_tokens"].get_value().sharding.is_equivalent_to(embed.sharding, 2)
  other = Sampler(trained, mesh, dataclasses.replace(ec, kv_layout="slots"), sp, [EOS])
  assert all(a is b for a, b in zip(jax.tree.leaves(other.runner.params), jax.tree.leaves(s.runner.params)))
  s.update_params(trainer, version=1)
  got = s.generate(IDS, SEEDS, n=2)
  assert {v for c in got for v in c.versions} == {1}
  same([c._replace(versions=(0,) * len(c.versions)) for c in got], want)
