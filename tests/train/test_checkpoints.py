"""Checkpoints on Orbax's commit protocol, local and on a bucket: a half-written step is never loaded, a
step damaged after its commit makes every host fall back to the previous good one (invariant 5)."""
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from jaxpod import runtime
from jaxpod.io import CheckpointConfig, Checkpointer, verify
from jaxpod.runtime import storage


@pytest.fixture(scope="module")
def mesh():
  runtime.init()
  return runtime.make_mesh()


@pytest.fixture(params=["local", "gcs"])
def ckpt_url(request, tmp_path):
  """The checkpoint folder: a local path, or a gs:// URL on the test GCS server."""
  if request.param == "local":
    return str(tmp_path / "ck")
  return storage.join(request.getfixturevalue("bucket"), "run", "ck")


def _tree(mesh, value: float):
  sharded = NamedSharding(mesh, PartitionSpec("data"))
  return {"w": jax.device_put(jnp.full((8, 4), value), sharded),
          "step": jax.device_put(jnp.asarray(int(value), jnp.int32), NamedSharding(mesh, PartitionSpec()))}


def _target(tree):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def _save_steps(url, mesh, steps):
  ckpt = Checkpointer(CheckpointConfig(dir=url, keep_last=5))
  for s in steps:
    ckpt.save(s, _tree(mesh, float(s)), {"next_index": s})
  ckpt.close()


def _restore(url, mesh):
  ckpt = Checkpointer(CheckpointConfig(dir=url, keep_last=5))
  out = ckpt.restore(_target(_tree(mesh, 0.0)))
  ckpt.close()
  return out


def _array_files(step_url: str) -> list[str]:
  """The files holding the state's array bytes (OCDBT data files), largest first."""
  fs, path = storage.filesystem(step_url)
  files = [f for f in fs.find(path, detail=True).values() if "/state/" in f["name"] and "/d/" in f["name"]]
  return [f["name"] for f in sorted(files, key=lambda f: -f["size"])]


def test_round_trip_restores_sharded_arrays_and_data_state(ckpt_url, mesh):
  _save_steps(ckpt_url, mesh, [1, 2])
  step, tree, data_state = _restore(ckpt_url, mesh)
  assert step == 2 and data_state == {"next_index": 2}
  np.testing.assert_array_equal(np.asarray(tree["w"]), np.full((8, 4), 2.0))
  assert tree["w"].sharding.spec == PartitionSpec("data")


def test_truncated_file_in_newest_step_falls_back_to_previous(ckpt_url, mesh):
  _save_steps(ckpt_url, mesh, [1, 2, 3])
  fs, _ = storage.filesystem(ckpt_url)
  for victim in _array_files(storage.join(ckpt_url, "3")):
    fs.pipe_file(victim, fs.cat_file(victim)[:7])
  step, tree, _ = _restore(ckpt_url, mesh)
  assert step == 2
  np.testing.assert_array_equal(np.asarray(tree["w"]), np.full((8, 4), 2.0))
  assert "3" not in storage.listdir(ckpt_url), "the bad step must be moved aside so it is never listed again"
  assert storage.listdir(ckpt_url.rstrip("/") + ".invalid")


def test_deleted_file_in_newest_step_falls_back_to_previous(ckpt_url, mesh):
  _save_steps(ckpt_url, mesh, [1, 2])
  for victim in _array_files(storage.join(ckpt_url, "2")):
    storage.remove(victim if "://" not in ckpt_url else f"gs://{victim}")
  step, _, data_state = _restore(ckpt_url, mesh)
  assert step == 1 and data_state == {"next_index": 1}


def test_half_written_step_is_never_loaded(tmp_path, mesh):
  """A save that never finished (Orbax's temporary folder, no commit) is not a step."""
  url = str(tmp_path / "ck")
  _save_steps(url, mesh, [1, 2])
  shutil.copytree(tmp_path / "ck" / "2", tmp_path / "ck" / "3.orbax-checkpoint-tmp-1")
  step, _, _ = _restore(url, mesh)
  assert step == 2


def test_uncommitted_step_on_a_bucket_is_never_loaded(bucket, mesh):
  """On an object store Orbax marks a finished step with a commit file; without it the step is skipped."""
  url = storage.join(bucket, "ck")
  _save_steps(url, mesh, [1, 2])
  fs, path = storage.filesystem(url)
  markers = [f for f in fs.find(f"{path}/2") if f.endswith("commit_success.txt")]
  assert markers, fs.find(f"{path}/2")
  for m in markers:
    fs.rm(m)
  step, _, _ = _restore(url, mesh)
  assert step == 1


def test_no_good_checkpoint_means_a_fresh_start(ckpt_url, mesh):
  _save_steps(ckpt_url, mesh, [1])
  for victim in _array_files(storage.join(ckpt_url, "1")):
    storage.remove(victim if "://" not in ckpt_url else f"gs://{victim}")
  assert _restore(ckpt_url, mesh) is None


def test_verify_names_the_damaged_step(ckpt_url, mesh):
  _save_steps(ckpt_url, mesh, [1, 2])
  fs, _ = storage.filesystem(ckpt_url)
  for victim in _array_files(storage.join(ckpt_url, "1")):
    fs.pipe_file(victim, fs.cat_file(victim)[:7])
  report = dict(verify(ckpt_url))
  assert report[2] is None
  assert report[1] is not None and report[1]


def test_checkpoint_verify_cli_names_damaged_steps(tmp_path, mesh, capsys):
  """`jaxpod checkpoint verify RUN_OR_CHECKPOINTS`: one line per step, exit 1 when one is damaged."""
  from jaxpod.cli.main import main
  url = str(tmp_path / "run" / "checkpoints")
  _save_steps(url, mesh, [1, 2])
  assert main(["checkpoint", "verify", str(tmp_path / "run")]) == 0
  for victim in _array_files(storage.join(url, "1")):
    storage.remove(victim)
  assert main(["checkpoint", "verify", url]) == 1
  out = capsys.readouterr().out
  assert "step 2: ok" in out and "step 1: DAMAGED" in out
  assert main(["checkpoint", "verify", str(tmp_path / "nothing")]) == 2
