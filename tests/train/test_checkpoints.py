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


def _verify_growth(url: str) -> dict:
  import json
  import os
  import subprocess
  import sys
  from pathlib import Path
  worker = Path(__file__).parent / "workers" / "verify_rss.py"
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  out = subprocess.run([sys.executable, str(worker), url], capture_output=True, text=True, env=env, timeout=120)
  assert out.returncode == 0, out.stderr[-2000:]
  return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_verify_memory_is_bounded_by_a_leaf_not_the_state(tmp_path, mesh):
  """`jaxpod checkpoint verify` reads a leaf at a time: on a 192 MiB state of 48 leaves of 4 MiB its peak resident
  memory grows by a bounded number of leaves (decode buffer + array + allocator slack: measured 7-10), not by the
  state as a whole restore does (invariant 10: no host holds more than its share plus a few tensors)."""
  url = str(tmp_path / "ck")
  leaf = 4 * 2**20
  replicated = NamedSharding(mesh, PartitionSpec())
  tree = {"params": {f"w{i}": jax.device_put(jnp.arange(leaf // 4, dtype=jnp.float32) + i, replicated)
                     for i in range(48)}, "step": jax.device_put(jnp.int32(1), replicated)}
  ckpt = Checkpointer(CheckpointConfig(dir=url, async_save=False))
  ckpt.save(1, tree, {"next_index": 0})
  ckpt.close()
  del tree
  measured = _verify_growth(url)
  assert measured["report"] == [[1, None]]
  growth = measured["growth"]
  assert growth < 16 * leaf, f"verify grew resident memory by {growth / 2**20:.0f} MiB for {leaf / 2**20:.0f} MiB leaves"
  assert measured["whole"] > 48 * leaf  # the measurement sees a whole-state restore


def test_a_checkpoint_of_per_layer_leaves_restores_into_the_stacked_layers(tmp_path, mesh):
  """A run saved before the decoder's layers were stacked (`params/layers/<i>/w`) resumes into today's stacked leaf
  (`params/layers/w` [L, ...]) with the same values, placed like the target; a layer missing is a mismatch."""
  from jaxpod.io.checkpoints import CheckpointMismatch
  rows = NamedSharding(mesh, PartitionSpec(None, "data"))
  layers = [np.full((8, 4), float(i), np.float32) for i in range(3)]
  old = {"params": {"layers": {str(i): {"w": jax.device_put(w, NamedSharding(mesh, PartitionSpec("data")))}
                               for i, w in enumerate(layers)}, "norm": jnp.ones((4,))}}
  ckpt = Checkpointer(CheckpointConfig(dir=str(tmp_path / "ck")))
  ckpt.save(7, old, {"next_index": 7})
  ckpt.close()
  target = {"params": {"layers": {"w": jax.ShapeDtypeStruct((3, 8, 4), jnp.float32, sharding=rows)},
                       "norm": jax.ShapeDtypeStruct((4,), jnp.float32)}}
  ckpt = Checkpointer(CheckpointConfig(dir=str(tmp_path / "ck")))
  step, state, data = ckpt.restore(target)
  ckpt.close()
  assert (step, data) == (7, {"next_index": 7})
  w = state["params"]["layers"]["w"]
  np.testing.assert_array_equal(np.asarray(w), np.stack(layers))
  assert w.sharding.is_equivalent_to(rows, 3)
  target["params"]["layers"]["w"] = jax.ShapeDtypeStruct((4, 8, 4), jnp.float32, sharding=rows)  # one layer more
  ckpt = Checkpointer(CheckpointConfig(dir=str(tmp_path / "ck")))
  with pytest.raises(CheckpointMismatch, match="params/layers/w"):
    ckpt.restore(target)
  ckpt.close()


def test_a_bf16_checkpoint_resumes_into_float32_master_weights(tmp_path, mesh):
  """Turning on float32 master weights (`model.param_dtype: float32`) for a run saved in bf16 resumes it: each leaf
  comes back in the target's dtype with the saved values (bf16 -> float32 is exact)."""
  rows = NamedSharding(mesh, PartitionSpec("data"))
  saved = jnp.asarray(np.linspace(-3, 3, 32).reshape(8, 4), jnp.bfloat16)
  ckpt = Checkpointer(CheckpointConfig(dir=str(tmp_path / "ck")))
  ckpt.save(3, {"params": {"w": jax.device_put(saved, rows)}}, {"next_index": 3})
  ckpt.close()
  ckpt = Checkpointer(CheckpointConfig(dir=str(tmp_path / "ck")))
  step, state, _ = ckpt.restore({"params": {"w": jax.ShapeDtypeStruct((8, 4), jnp.float32, sharding=rows)}})
  ckpt.close()
  w = state["params"]["w"]
  assert step == 3 and w.dtype == jnp.float32
  np.testing.assert_array_equal(np.asarray(w), np.asarray(saved.astype(jnp.float32)))
