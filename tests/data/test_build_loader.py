"""Dataset builder (held-out test, idempotent) and the grain loader (determinism, sharding, resume)."""
from __future__ import annotations

import os

import numpy as np
import pytest

from jaxpod.data.sudoku import SudokuDataConfig, SudokuLoader, build, class_keys, ensure_dataset, fmt, validate_batch

CFG = SudokuDataConfig(box="2x3", train=40, test=24, aug=3, seed=7)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
  return build(CFG, str(tmp_path_factory.mktemp("ds") / "sudoku"))


def test_test_split_is_held_out(dataset):
  """No test puzzle is an augmentation of a training puzzle (the accuracy target is on unseen puzzles)."""
  train, test = fmt.read(dataset, "train"), fmt.read(dataset, "test")
  assert train.num_groups == 40 and len(train) == 160 and len(test) == 24 and test.num_groups == 24
  train_keys = set(class_keys(fmt.decode(train.inputs), "2x3"))
  assert not train_keys & set(class_keys(fmt.decode(test.inputs), "2x3"))
  assert len(set(class_keys(fmt.decode(train.inputs[::4]), "2x3"))) == 40
  assert (train.labels >= 2).all() and train.metadata["vocab_size"] == 8


def test_build_idempotent_and_deterministic(dataset, tmp_path):
  """Same config -> folder reused untouched; built elsewhere -> identical arrays; other config refused."""
  stamp = os.path.getmtime(f"{dataset}/train/all__inputs.npy")
  assert build(CFG, dataset) == dataset
  assert os.path.getmtime(f"{dataset}/train/all__inputs.npy") == stamp
  again = ensure_dataset(CFG, str(tmp_path))
  assert again.startswith(str(tmp_path)) and CFG.fingerprint() in again
  for split in fmt.SPLITS:
    assert (fmt.read(again, split).inputs == fmt.read(dataset, split).inputs).all()
  with pytest.raises(FileExistsError, match="--out"):
    build(SudokuDataConfig(box="2x3", train=41, test=24, aug=3, seed=7), dataset)
  with pytest.raises(ValueError, match="SudokuDataConfig.aug"):
    SudokuDataConfig(aug=-1)


def _loader(path, gb, shard=0, shards=1, seed=0, **kw):
  return SudokuLoader(path, gb, seed=seed, shard_index=shard, shard_count=shards, **kw)


def test_train_batches_shape_and_epochs(dataset):
  """One epoch visits every group once; shapes and dtypes are what the trainer jits against."""
  lo = _loader(dataset, 8)
  assert lo.steps_per_epoch == 5 and lo.steps_for_epochs(2) == 10
  batches = list(lo.train_iter(lo.steps_for_epochs(2)))
  assert len(batches) == 10
  b = batches[0]
  assert b["inputs"].shape == (8, 36) and b["inputs"].dtype == np.int32
  assert b["labels"].dtype == np.int32 and b["puzzle_identifiers"].shape == (8,) and b["mask"].all()
  train = fmt.read(dataset, "train")
  solutions = {tuple(x) for x in train.labels.astype(np.int32)}
  group_of = {tuple(x): i // 4 for i, x in enumerate(train.inputs.astype(np.int32))}
  for epoch in range(2):
    groups = [group_of[tuple(x)] for bb in batches[epoch * 5:(epoch + 1) * 5] for x in bb["inputs"]]
    assert sorted(groups) == list(range(40))
  assert all(tuple(y) in solutions for y in b["labels"])


@pytest.mark.parametrize("gb", [12, 48])
def test_epochs_chain_across_batches(dataset, gb):
  """Batches may straddle epochs (even exceed one): each epoch's 40 positions still hold every group once."""
  lo = _loader(dataset, gb)
  train = fmt.read(dataset, "train")
  group_of = {tuple(x): i // 4 for i, x in enumerate(train.inputs.astype(np.int32))}
  stream = [group_of[tuple(x)] for b in lo.train_iter(lo.steps_for_epochs(3)) for x in b["inputs"]]
  assert len(stream) == (120 // gb) * gb
  for e in range(len(stream) // 40):
    assert sorted(stream[e * 40:(e + 1) * 40]) == list(range(40))


def test_deterministic_and_seeded(dataset):
  a = [x["inputs"] for _, x in zip(range(7), _loader(dataset, 8, seed=1).train_iter())]
  b = [x["inputs"] for _, x in zip(range(7), _loader(dataset, 8, seed=1).train_iter())]
  c = [x["inputs"] for _, x in zip(range(7), _loader(dataset, 8, seed=2).train_iter())]
  assert all((x == y).all() for x, y in zip(a, b))
  assert not all((x == y).all() for x, y in zip(a, c))


@pytest.mark.parametrize("hosts", [2, 4])
def test_sharding_disjoint_and_complete(dataset, hosts):
  """Invariant 1 (same shapes everywhere): host slices are disjoint, equal-sized, and form the 1-host global batch."""
  one = _loader(dataset, 8)
  many = [_loader(dataset, 8, shard=h, shards=hosts) for h in range(hosts)]
  for step in (0, 3, 6):
    parts = [m.train_batch(step) for m in many]
    assert all(p["inputs"].shape == (8 // hosts, 36) for p in parts)
    for key in ("inputs", "labels", "puzzle_identifiers", "mask"):
      assert (np.concatenate([p[key] for p in parts]) == one.train_batch(step)[key]).all()
  evals = [list(m.eval_iter()) for m in many]
  whole = list(one.eval_iter())
  for i, batch in enumerate(whole):
    assert (np.concatenate([e[i]["inputs"] for e in evals]) == batch["inputs"]).all()


def test_state_round_trip_continues_exactly(dataset):
  """Invariant 5 (resume is global): state is the global step; a fresh iterator set to it continues exactly."""
  it = _loader(dataset, 8, seed=3).train_iter()
  for _ in range(6):
    next(it)
  state = it.get_state()
  want = [next(it)["inputs"] for _ in range(6)]
  fresh = _loader(dataset, 8, seed=3).train_iter()
  fresh.set_state(state)
  assert state == {"next_index": 6}
  assert all((next(fresh)["inputs"] == w).all() for w in want)


def test_eval_in_order_with_padding(dataset):
  """Eval covers the test split in order once; pad rows: inputs 0, labels -100, mask False."""
  lo = _loader(dataset, 10)
  batches = list(lo.eval_iter())
  test = fmt.read(dataset, "test")
  assert lo.eval_steps == len(batches) == 3
  real = np.concatenate([b["inputs"][b["mask"]] for b in batches])
  assert (real == test.inputs).all()
  last = batches[-1]
  assert last["mask"].sum() == 4 and (last["inputs"][4:] == 0).all() and (last["labels"][4:] == -100).all()
  assert (last["labels"][:4] == test.labels[20:]).all()


def test_validate_batch_before_init():
  """Invariant 7 (validate before the expensive part): batch/host/device mismatches, with field and fix."""
  assert validate_batch(768, hosts=2, data_parallel=4) == 384
  with pytest.raises(ValueError, match=r"global_batch_size 770 is not divisible by 4 .* e.g. 772"):
    validate_batch(770, hosts=2, data_parallel=4)
  with pytest.raises(ValueError, match=r"multiple of hosts"):
    validate_batch(8, hosts=4, data_parallel=2)
  with pytest.raises(ValueError, match="multiple of the 3 hosts"):
    SudokuLoader("unused", 8, shard_index=0, shard_count=3)


def test_concurrent_builders_share_one_folder(tmp_path):
  """Invariant 4 (shared things written safely): hosts building one cache folder at once never see a partial one."""
  import concurrent.futures

  cfg = SudokuDataConfig.tiny()
  with concurrent.futures.ThreadPoolExecutor(3) as pool:
    paths = list(pool.map(lambda _: ensure_dataset(cfg, str(tmp_path)), range(3)))
  assert len(set(paths)) == 1 and os.listdir(tmp_path) == [os.path.basename(paths[0])]
  assert len(fmt.read(paths[0], "train")) == cfg.train * (cfg.aug + 1)
