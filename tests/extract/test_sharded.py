"""The sharded capture forward: values within the stated tolerance across meshes, the memory plan.

Single process, 8 CPU devices. The exact path (the `baseline` fixture) equals HF within 1e-5;
`sharded.TOLERANCE` bounds the sharded path against it on any mesh.
"""
import numpy as np
import pytest

from jaxpod import extract
from jaxpod.extract.sharded import TOLERANCE
from jaxpod.runtime import MeshConfig
from tests.extract.conftest import (BASE_OPTIONS, BUDGET, PROMPTS, assert_close_dataset, hf_captures,
                                    write_checkpoint)


@pytest.mark.parametrize("mesh", [(8, 1, 1), (4, 1, 2), (1, 2, 4)])
def test_sharded_equals_exact_within_tolerance_on_any_mesh(baseline, tiny_ckpt, mesh):
  """float32: data=8, data=4 x model=2, fsdp=2 x model=4 all within TOLERANCE of the exact path."""
  model, _, prompts = tiny_ckpt
  out = f"memory://extract-tests/sharded-{'x'.join(map(str, mesh))}"
  cfg = extract.ExtractConfig(hf=model, prompts=prompts, out=out, batch_size=8, mesh=MeshConfig(*mesh),
                              **BASE_OPTIONS)
  assert cfg.forward == "sharded"
  extract.run(cfg)
  assert_close_dataset(extract.open(out), baseline, TOLERANCE["float32"])


def test_bf16_model_sharded_within_tolerance_of_exact(tmp_path, tiny_ckpt):
  """A bfloat16 checkpoint computes in bfloat16: fsdp=2 x model=4 vs the exact path within TOLERANCE["bfloat16"]."""
  import torch
  _, _, prompts = tiny_ckpt
  folder = str(tmp_path / "bf16")
  write_checkpoint(folder).to(torch.bfloat16).save_pretrained(folder)
  runs = {}
  for forward, mesh in (("exact", (8, 1, 1)), ("sharded", (1, 2, 4))):
    out = f"memory://extract-tests/bf16model-{forward}"
    extract.run(extract.ExtractConfig(hf=folder, prompts=prompts, out=out, batch_size=8, forward=forward,
                                      mesh=MeshConfig(*mesh), dtype="bf16", **BASE_OPTIONS))
    runs[forward] = extract.open(out)
  assert_close_dataset(runs["sharded"], runs["exact"], TOLERANCE["bfloat16"])


def test_memory_plan_refuses_exact_and_sharded_fits_model_larger_than_budget(tiny_ckpt):
  """Whole weights > device_memory_bytes: the exact path is refused before compiling, naming --forward sharded;
  the sharded path on fsdp=2 x model=2 extracts it, equal to HF hidden states within tolerance."""
  model, hf_model, prompts = tiny_ckpt
  options = dict(BASE_OPTIONS, device_memory_bytes=BUDGET)
  exact = extract.ExtractConfig(hf=model, prompts=prompts, out="memory://extract-tests/budget-exact",
                                batch_size=4, forward="exact", mesh=MeshConfig(2, 2, 2), **options)
  with pytest.raises(ValueError, match=r"exceeds .* the largest part is gathered: use --forward sharded"):
    extract.run(exact)
  sharded = extract.ExtractConfig(hf=model, prompts=prompts, out="memory://extract-tests/budget-sharded",
                                  batch_size=4, mesh=MeshConfig(2, 2, 2), **options)
  extract.run(sharded)
  ds = extract.open(sharded.out)
  assert ds.num_rows == len(PROMPTS)
  for row in range(ds.num_rows):
    m = ds.mask[row]
    hooks, hs = hf_captures(hf_model, ds.tokens[row][m].tolist())
    for k in ds.keys:
      want = hs[1] if k == "resid.0" else hooks[k]
      got = ds[k][row][m]
      assert np.abs(got - want).max() <= TOLERANCE["float32"] * np.abs(want).max() + 1e-6, (row, k)
  with pytest.raises(ValueError, match=r"largest part is activations: lower --batch_size=64"):
    extract.run(extract.ExtractConfig(hf=model, prompts=prompts, out="memory://extract-tests/budget-big",
                                      batch_size=64, mesh=MeshConfig(2, 2, 2), **options))


def test_compiled_forward_gathers_one_block_at_a_time():
  """XLA's temp memory of the sharded forward (fsdp=8) stays below the plan's gathered + activations +
  captures, a fraction of the whole weights (with the blocks unrolled XLA CPU gathered them all: temp > whole)."""
  import jax
  from flax import nnx
  from jaxpod import runtime
  from jaxpod.extract import memory, sharded
  from jaxpod.models.llama import model as model_lib
  from jaxpod.models.llama.config import LlamaConfig
  from jaxpod.runtime.sharding import state_shardings
  mc = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=512, num_hidden_layers=8, num_attention_heads=4,
                   num_key_value_heads=2, max_position_embeddings=128)
  cfg = extract.ExtractConfig(hf="m", prompts="p", out="o", layers=(3, 7), batch_size=8, mesh=MeshConfig(1, 8, 1))
  mesh = runtime.make_mesh(1, 8, 1)
  with jax.set_mesh(mesh):
    _, state = nnx.split(model_lib.abstract(mc))
    fwd = sharded.ShardedForward(model_lib.init(mc, shardings=state_shardings(state, mesh)), mesh, cfg)
    tokens = jax.ShapeDtypeStruct((8, 32), np.int32, sharding=fwd.in_sharding)
    temp = fwd._fn.lower(fwd.params, tokens, tokens.update(dtype=bool)).compile().memory_analysis().temp_size_in_bytes
  plan = memory.memory_plan(mc, cfg, mesh, 32)
  whole = sum(int(np.prod(v.shape)) * 4 for v in jax.tree.leaves(state))
  assert temp <= plan["gathered"] + plan["activations"] + plan["captures"] < whole / 2, (temp, plan, whole)
