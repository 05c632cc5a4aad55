"""Checkpoints: a corrupt or half-written step is never loaded, the previous good one is (invariant 5)."""
import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from jaxpod import runtime
from jaxpod.io import CheckpointConfig, Checkpointer
from jaxpod.io.checkpoints import MANIFEST


@pytest.fixture(scope="module")
def mesh():
  runtime.init()
  return runtime.make_mesh()


def _tree(mesh, value: float):
  sharded = NamedSharding(mesh, PartitionSpec("data"))
  return {"w": jax.device_put(jnp.full((8, 4), value), sharded),
          "step": jax.device_put(jnp.asarray(int(value), jnp.int32), NamedSharding(mesh, PartitionSpec()))}


def _target(tree):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def _save_steps(path, mesh, steps):
  ckpt = Checkpointer(CheckpointConfig(dir=str(path), keep_last=5))
  for s in steps:
    ckpt.save(s, _tree(mesh, float(s)), {"next_index": s})
  ckpt.close()


def _restore(path, mesh):
  ckpt = Checkpointer(CheckpointConfig(dir=str(path), keep_last=5))
  out = ckpt.restore(_target(_tree(mesh, 0.0)))
  ckpt.close()
  return out


def _biggest_file(step_dir: Path) -> Path:
  return max((p for p in step_dir.rglob("*") if p.is_file() and p.name != MANIFEST), key=lambda p: p.stat().st_size)


def test_round_trip_restores_sharded_arrays_and_data_state(tmp_path, mesh):
  _save_steps(tmp_path / "ck", mesh, [1, 2])
  step, tree, data_state = _restore(tmp_path / "ck", mesh)
  assert step == 2 and data_state == {"next_index": 2}
  np.testing.assert_array_equal(np.asarray(tree["w"]), np.full((8, 4), 2.0))
  assert tree["w"].sharding.spec == PartitionSpec("data")


def test_corrupt_latest_checkpoint_falls_back_to_previous(tmp_path, mesh):
  """A damaged file (same size, different bytes) in the newest step: the previous step is loaded."""
  _save_steps(tmp_path / "ck", mesh, [1, 2, 3])
  victim = _biggest_file(tmp_path / "ck" / "3")
  data = bytearray(victim.read_bytes())
  data[len(data) // 2] ^= 0xFF
  victim.write_bytes(bytes(data))
  step, tree, _ = _restore(tmp_path / "ck", mesh)
  assert step == 2
  np.testing.assert_array_equal(np.asarray(tree["w"]), np.full((8, 4), 2.0))
  assert not (tmp_path / "ck" / "3").exists(), "the bad step must be moved aside so it is never listed again"
  assert list((tmp_path / "ck.invalid").iterdir())


def test_half_written_checkpoints_are_never_loaded(tmp_path, mesh):
  """Truncated file, missing manifest (crash before commit), Orbax temp folder: all skipped."""
  _save_steps(tmp_path / "ck", mesh, [1, 2, 3, 4])
  victim = _biggest_file(tmp_path / "ck" / "4")
  victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])  # truncated
  (tmp_path / "ck" / "3" / MANIFEST).unlink()  # saved but never committed
  shutil.copytree(tmp_path / "ck" / "2", tmp_path / "ck" / "5.orbax-checkpoint-tmp-1")  # a save in flight
  step, tree, data_state = _restore(tmp_path / "ck", mesh)
  assert step == 2 and data_state == {"next_index": 2}
  np.testing.assert_array_equal(np.asarray(tree["w"]), np.full((8, 4), 2.0))


def test_no_good_checkpoint_means_a_fresh_start(tmp_path, mesh):
  _save_steps(tmp_path / "ck", mesh, [1])
  (tmp_path / "ck" / "1" / MANIFEST).write_text(json.dumps({"files": {"missing": [1, 0]}}))
  assert _restore(tmp_path / "ck", mesh) is None
