"""Writer pieces in one process (8 CPU devices): replica-0 placement and shard encoding.

DESIGN.md invariant 4 / reference/llm.md bug 1: concatenating every addressable shard
duplicates rows replicated over `model` and mangles a sharded hidden axis; replica-0 pieces
placed by `shard.index` do neither.
"""
import jax
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxpod.extract import writer
from jaxpod.runtime import make_mesh


@pytest.fixture(scope="module")
def mesh():
  if len(jax.devices()) < 8:
    pytest.skip("needs 8 CPU devices (tests/conftest.py sets JAX_NUM_CPU_DEVICES=8)")
  return make_mesh(data=2, fsdp=1, model=4)


@pytest.mark.parametrize("spec", [P("data"), P("data", None, "model"), P(("data", "model")), P()])
def test_replica0_pieces_placed_by_global_index(mesh, spec):
  x_np = np.arange(8 * 3 * 8, dtype=np.float32).reshape(8, 3, 8)
  x = jax.device_put(x_np, NamedSharding(mesh, spec))
  rows, values = writer.replica0_rows(x)
  assert rows.tolist() == list(range(8))  # every row once, in global order
  np.testing.assert_array_equal(values, x_np)
  naive = np.concatenate([np.asarray(s.data) for s in sorted(x.addressable_shards, key=lambda s: s.device.id)])
  if spec != P(("data", "model")):  # the field bug: duplicated rows or a wrong shape
    assert naive.shape != x_np.shape or not np.array_equal(naive, x_np)


def test_encode_is_deterministic_and_keeps_bf16():
  a = np.linspace(-3, 3, 24, dtype=np.float32).reshape(2, 3, 4)
  tensors = {"resid.1": a.astype(ml_dtypes.bfloat16), "row_ids": np.arange(2), "mask": np.ones((2, 3), np.uint8)}
  raw = writer.encode(tensors, {"run": "r", "batch": 3})
  assert raw == writer.encode(dict(reversed(list(tensors.items()))), {"batch": 3, "run": "r"})
  got, meta = writer.decode(raw)
  assert got["resid.1"].dtype == ml_dtypes.bfloat16 and got["resid.1"].tobytes() == tensors["resid.1"].tobytes()
  assert meta["batch"] == 3 and meta["dtypes"]["resid.1"] == "bfloat16"
  import fsspec
  fs = fsspec.filesystem("memory")
  fs.pipe_file("/writer-test/x.safetensors", raw)
  part = writer.read_ranged(fs, "/writer-test/x.safetensors", ["row_ids", "resid.1"])
  assert part.keys() == {"row_ids", "resid.1"} and part["resid.1"].tobytes() == tensors["resid.1"].tobytes()
