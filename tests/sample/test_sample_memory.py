"""KV memory by data shard (DESIGN.md invariant 10: every host holds only its share): the memory plan counts one
data shard's page pool, and the check of a train state plus every engine's KV cache against device memory
refuses in one line naming the knob (the pool's arrays themselves: test_sample_layout.py)."""
import dataclasses

import jax
import pytest

from jaxpod.models.llama import tiny
from jaxpod.models.llama.kv import PagedKVCache
from jaxpod.runtime import make_mesh
from jaxpod.sample import EngineConfig
from jaxpod.sample.memory import EngineMemory, check_train_and_engines, engine_knob

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


def test_tree_bytes_per_device_counts_one_shard():
  """A train state's bytes per device: its arrays' shards, or abstract leaves by their shardings."""
  import jax.numpy as jnp
  from jax.sharding import NamedSharding, PartitionSpec
  from jaxpod.sample.memory import tree_bytes_per_device
  mesh = make_mesh(data=1, fsdp=4, devices=jax.devices()[:4])
  split, whole = NamedSharding(mesh, PartitionSpec("fsdp")), NamedSharding(mesh, PartitionSpec())
  state = {"w": jax.device_put(jnp.zeros((8, 4)), split), "b": jax.device_put(jnp.zeros((4,)), whole)}
  assert tree_bytes_per_device(state) == 2 * 4 * 4 + 4 * 4
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
  assert tree_bytes_per_device(abstract, {"w": split, "b": whole}) == 48
