"""KV memory by data shard (DESIGN.md invariant 10: every host holds only its share): the paged pool splits over
the data axes (a device holds its shard's pages, the same tokens come out), and the check of a train state plus
every engine's KV cache against device memory refuses in one line naming the knob."""
import dataclasses

import jax
import pytest

from jaxpod.models.llama import hf_io, tiny
from jaxpod.models.llama.kv import PagedKVCache
from jaxpod.runtime import make_mesh
from jaxpod.sample import EngineConfig, Sampler, SamplingParams
from jaxpod.sample.memory import EngineMemory, check_train_and_engines, engine_knob, kv_cache_bytes

from sample_fixtures import EOS, IDS, SEEDS, SMALL, STOP, same, small_sampler

MiB = 2 ** 20


def test_train_state_plus_engines_checked_in_one_line():
  """Numbers in: fits -> the parts back; too big -> one line with every part, naming the largest part's knob."""
  ec = EngineConfig(batch_size=128, max_prompt_len=16, max_new_tokens=512, kv_layout="paged")
  rollout = EngineMemory("rollout", 300 * MiB, 0, engine_knob("rl.rollout", ec))
  evals = EngineMemory("eval", 50 * MiB, 40 * MiB, engine_knob("rl.rollout", ec, "eval_slots"))
  parts = check_train_and_engines(200 * MiB, [rollout, evals], available=1000 * MiB)
  assert parts == {"train_state": 200 * MiB, "rollout kv_cache": 300 * MiB, "eval kv_cache": 50 * MiB,
                   "eval weights": 40 * MiB}
  with pytest.raises(ValueError, match=r"rl memory check: train_state 200.0 MiB \+ rollout kv_cache 300.0 MiB .* "
                                       r"exceeds 450.0 MiB .* the largest part is rollout kv_cache: lower "
                                       r"rl.rollout.batch_size=128 or rl.rollout.max_new_tokens=512") as e:
    check_train_and_engines(200 * MiB, [rollout, evals], available=500 * MiB)
  assert "\n" not in str(e.value) and "--mesh.data" in str(e.value)
  with pytest.raises(ValueError, match=r"largest part is train_state: shard the train state more \(raise "
                                       r"--mesh.fsdp") as e:
    check_train_and_engines(900 * MiB, [rollout], available=1000 * MiB)
  assert "\n" not in str(e.value)


def test_paged_pool_split_by_data_shard_same_tokens(model, tiny_ckpt):
  """data=4: the pool is [L, 4, P, ...] with one shard per device (a quarter of the one-device pool's bytes, as
  `kv_cache_bytes` predicts); a pool of 1 sequence per shard preempts, and n=2 samples share prompt
  pages within their shard: the tokens equal the one-device engine's."""
  sp = SamplingParams(temperature=0.8, top_k=20, top_p=0.9)
  want = small_sampler(model, sp, kv_layout="paged").generate(IDS, SEEDS, n=2)
  mesh = make_mesh(data=4, devices=jax.devices()[:4])
  ec = EngineConfig(**(SMALL | dict(kv_layout="paged", batch_size=8, prefill_batch=4, num_pages=4 * 12)))
  s = Sampler(hf_io.load(tiny_ckpt, mesh), mesh, ec, sp, [EOS, STOP])
  same(s.generate(IDS, SEEDS, n=2), want)
  assert s.last.preemptions > 0 and s.last.pool.free == 4 * 11
  cfg = model.cfg
  assert s.runner.k.shape == (cfg.num_hidden_layers, 4, 12, 4, cfg.num_key_value_heads, cfg.head_dim_)
  shard = s.runner.k.addressable_shards[0].data
  assert shard.shape == (cfg.num_hidden_layers, 1, 12, 4, cfg.num_key_value_heads, cfg.head_dim_)
  per_device = 2 * shard.nbytes
  one = make_mesh(devices=jax.devices()[:1])
  assert per_device == kv_cache_bytes(cfg, ec, mesh) == kv_cache_bytes(cfg, ec, one) // 4
  assert per_device == 12 * PagedKVCache.page_bytes(cfg, 4)


def test_sample_memory_check_counts_a_shards_pool():
  """`jaxpod sample`'s check: the paged KV part per device shrinks by the data-axis size."""
  from jaxpod.sample import memory_plan
  cfg = tiny(dtype="float32")
  ec = EngineConfig(batch_size=8, max_prompt_len=16, max_new_tokens=16, page_size=4, num_pages=8 * 9,
                    kv_layout="paged")
  one = memory_plan(cfg, ec, make_mesh(devices=jax.devices()[:1]))["kv_cache"]
  four = memory_plan(cfg, ec, make_mesh(data=4, devices=jax.devices()[:4]))["kv_cache"]
  assert four * 4 == one == 72 * PagedKVCache.page_bytes(cfg, 4)
  with pytest.raises(ValueError, match=r"sample.num_pages=16 splits into 4 pages per data shard .* set "
                                       r"num_pages >= 36"):
    from jaxpod.sample import check_batch
    check_batch(dataclasses.replace(ec, num_pages=16), make_mesh(data=4, devices=jax.devices()[:4]))
