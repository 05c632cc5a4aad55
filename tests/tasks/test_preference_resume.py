"""DPO's frozen reference (`task.reference: in_step`) on resume (`train.rebuilt`): checkpoints hold a digest of it,
not a copy; a resume rebuilds it from the starting weights and trains exactly as without the interruption; a
starting checkpoint that changed since fails in one line; a checkpoint that holds the reference resumes from it."""
import json
import shutil

import numpy as np
import pytest

from jaxpod.runtime import storage
from jaxpod.train import Hook
from tests.tasks.conftest import pref_args

DPO = dict(task__loss__kind="dpo", task__loss__beta=0.5, trainer__checkpoint_every=2)


class Stop(Hook):
  """Interrupts the run after step 3 (its newest checkpoint: step 2)."""

  every = 1

  def __call__(self, info):
    if info.step == 3:
      raise KeyboardInterrupt("stop")


def _train(runs, ckpt, pairs, name, hooks=(), **overrides):
  from jaxpod.cli.train import load_config
  from jaxpod.train import train
  return train(load_config(pref_args(runs, ckpt, pairs, steps=5, trainer__run_name=name, **DPO, **overrides)),
               extra_hooks=hooks)


def _losses(run_dir) -> list[tuple[int, float]]:
  lines = storage.read_text(storage.join(run_dir, "metrics.jsonl")).splitlines()
  return [(r["step"], r["loss"]) for r in map(json.loads, lines) if "loss" in r]


def _stored(run_dir, step: int) -> dict:
  """Checkpoint path -> bytes of each stored array of one step."""
  from etils import epath
  from jaxpod.io.checkpoints import _stored_leaves
  leaves = _stored_leaves(epath.Path(f"{run_dir}/checkpoints/{step}/state"))
  return {p: int(np.prod(m.shape)) * np.dtype(m.dtype).itemsize for p, m in leaves.items()}


def _copy(src, dst) -> str:
  shutil.copytree(src, dst)
  return str(dst)


def _another_checkpoint(folder) -> None:
  """Other weights of the same architecture, written over `folder`'s (tokenizer files kept)."""
  import jax
  from flax import nnx
  from jaxpod.models.llama import Llama, hf_io
  with jax.default_device(jax.devices("cpu")[0]):
    hf_io.save(Llama(hf_io.load_config(str(folder)), rngs=nnx.Rngs(params=7)), str(folder))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tiny_ckpt, pair_file):
  return _train(tmp_path_factory.mktemp("pref_full"), tiny_ckpt, pair_file, "full")


@pytest.mark.slow
def test_checkpoints_hold_a_digest_of_the_reference_and_a_resume_rebuilds_it(uninterrupted, tiny_ckpt, pair_file,
                                                                            tmp_path):
  """The checkpoint stores one copy of the weights fewer (the reference's bytes, less a [tensors, 2] digest); the
  run interrupted after step 3 resumes at step 2 with the reference rebuilt from task.hf: the same losses."""
  with pytest.raises(KeyboardInterrupt):
    _train(tmp_path, tiny_ckpt, pair_file, "cut", [Stop()])
  again = _train(tmp_path, tiny_ckpt, pair_file, "cut")
  assert again.resumed and again.start_step == 2
  assert _losses(again.run_dir) == _losses(uninterrupted.run_dir)
  stored = _stored(again.run_dir, 4)
  params = {p.removeprefix("params/"): n for p, n in stored.items() if p.startswith("params/")}
  assert not any(p.startswith("buffers/ref") for p in stored)
  assert {p: n for p, n in stored.items() if p.startswith("rebuilt/")} == {"rebuilt/ref": len(params) * 2 * 4}
  print(f"checkpoint bytes: {sum(stored.values())} (the reference's {sum(params.values())} no longer in it)")


@pytest.mark.slow
def test_a_starting_checkpoint_changed_since_the_run_started_fails_the_resume_in_one_line(tiny_ckpt, pair_file,
                                                                                        tmp_path):
  from jaxpod.train.rebuilt import BufferSourceChanged
  start = _copy(tiny_ckpt, tmp_path / "start")
  with pytest.raises(KeyboardInterrupt):
    _train(tmp_path, start, pair_file, "moved", [Stop()])
  _another_checkpoint(start)
  with pytest.raises(BufferSourceChanged, match=r"the frozen buffers 'ref' rebuilt from .*start differ from those "
                                                r"this run started with"):
    _train(tmp_path, start, pair_file, "moved")


@pytest.mark.slow
def test_a_checkpoint_written_with_the_reference_resumes_from_it(uninterrupted, tiny_ckpt, pair_file, tmp_path,
                                                                 monkeypatch):
  """Checkpoints written before the reference was rebuilt hold it: the resume reads it from there (here the
  starting checkpoint was even replaced since: the losses are still the uninterrupted run's)."""
  from jaxpod.tasks.preference import PreferenceTask
  start = _copy(tiny_ckpt, tmp_path / "start")
  with monkeypatch.context() as m:  # the trainer as it was: the whole state in every checkpoint
    m.setattr(PreferenceTask, "rebuilt_buffers", property(lambda self: ()))
    with pytest.raises(KeyboardInterrupt):
      _train(tmp_path, start, pair_file, "old", [Stop()])
  run_dir = f"{tmp_path}/old"
  assert any(p.startswith("buffers/ref/") for p in _stored(run_dir, 2)) and "rebuilt/ref" not in _stored(run_dir, 2)
  _another_checkpoint(start)
  again = _train(tmp_path, start, pair_file, "old")
  assert again.resumed and again.start_step == 2
  assert _losses(again.run_dir) == _losses(uninterrupted.run_dir)
