"""Build a Sudoku dataset folder (reference layout) from generated puzzles or a CSV file.

Train split: `train` source puzzles, each followed by `aug` augmentations (one group per
source puzzle, as the reference). Test split: `test` puzzles, not augmented, none of which
is an augmentation of a training puzzle (checked with `augment.class_keys`), and distinct
from each other. Building is idempotent: a folder whose `jaxpod.json` records the same
config is reused as is; a new one is written to a temporary sibling and renamed into place,
so concurrent builders (one per host) never see a half-written dataset.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import uuid

import fsspec
from fsspec.implementations.local import LocalFileSystem
import numpy as np

from jaxpod.data.sudoku import fmt
from jaxpod.data.sudoku.augment import class_keys, random_transforms
from jaxpod.data.sudoku.csv import read_csv
from jaxpod.data.sudoku.generate import Puzzles, generate
from jaxpod.data.sudoku.grid import Box

# Bump whenever the generator, augmentation or on-disk layout changes what a config produces:
# the cache folder is named by (config, FORMAT_VERSION), so a stale build is never reused.
FORMAT_VERSION = 2
ENV_CACHE = "JAXPOD_DATA_CACHE"


@dataclasses.dataclass(frozen=True)
class SudokuDataConfig:
  """What to generate; the dataset folder is a pure function of these fields."""

  box: str = "3x3"  # box shape RxC: 2x2 -> 4x4 grid, 2x3 -> 6x6, 3x3 -> 9x9
  train: int = 1000  # source puzzles in the train split
  test: int = 1000  # held-out puzzles in the test split
  aug: int = 1000  # augmentations per train puzzle (the original is kept too)
  seed: int = 0  # generator and augmentation seed
  clues: int | None = None  # clue target before uniqueness repair (fewer = harder); None = per-size default
  min_rating: int = 0  # keep only puzzles needing at least this many solver branch points
  minimize: bool = False  # remove clues until minimal (hardest, slower)

  def __post_init__(self):
    Box.parse(self.box)
    for name in ("train", "test", "aug", "min_rating"):
      if getattr(self, name) < 0:
        raise ValueError(f"SudokuDataConfig.{name} must be >= 0, got {getattr(self, name)}")
    if self.train < 1:
      raise ValueError(f"SudokuDataConfig.train must be >= 1, got {self.train}")
    cells = Box.parse(self.box).cells
    if self.clues is not None and not 0 <= self.clues <= cells:
      raise ValueError(f"SudokuDataConfig.clues must be in [0, {cells}] for box {self.box}, got {self.clues}")

  @classmethod
  def paper_like(cls) -> "SudokuDataConfig":
    """The paper's shape (1000 9x9 boards x 1000 augmentations, 1000 held out), generated puzzles."""
    return cls(box="3x3", train=1000, test=1000, aug=1000)

  @classmethod
  def tiny(cls) -> "SudokuDataConfig":
    """Seconds to build and to learn: 4x4 grids, for smoke tests."""
    return cls(box="2x2", train=64, test=32, aug=8)

  def fingerprint(self) -> str:
    """Short hash of the config and format version: names the cache folder."""
    blob = json.dumps({"v": FORMAT_VERSION, **dataclasses.asdict(self)}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def default_cache_root() -> str:
  """$JAXPOD_DATA_CACHE, else ~/.cache/jaxpod/data."""
  return os.environ.get(ENV_CACHE) or os.path.join(os.path.expanduser("~"), ".cache", "jaxpod", "data")


def cache_path(cfg: SudokuDataConfig, cache_root: str | None = None) -> str:
  """Where `ensure_dataset` keeps the dataset for cfg."""
  return f"{cache_root or default_cache_root()}/sudoku-{cfg.box}-{cfg.fingerprint()}"


def _distinct(num: int, cfg: SudokuDataConfig, box: Box, stream: int, exclude: set[bytes]) -> Puzzles:
  """num puzzles whose class keys are new (not in exclude, not repeated); adds them to exclude."""
  parts, have = [], 0
  for r in range(64):
    if have >= num:
      break
    ask = num - have if r == 0 else 2 * (num - have) + 8  # repeats are rare except on small grids
    batch = generate(ask, box, seed=(cfg.seed, stream, r), clues=cfg.clues,
                     min_rating=cfg.min_rating, minimize=cfg.minimize)
    keep = []
    for i, key in enumerate(class_keys(batch.inputs, box)):
      if key not in exclude and have + len(keep) < num:
        exclude.add(key)
        keep.append(i)
    parts.append(batch.take(np.asarray(keep, np.intp)))
    have += len(keep)
  if have < num:
    raise RuntimeError(f"only {have} of {num} distinct {box} puzzle classes found; ask for fewer "
                       "train/test puzzles or use a larger box (4x4 Sudoku has few distinct puzzles)")
  return Puzzles.concat(parts)


def augmented_split(p: Puzzles, box: Box, aug: int, rng: np.random.Generator) -> fmt.Split:
  """Each puzzle then `aug` random augmentations of it: one group of 1 + aug examples per puzzle."""
  k = aug + 1
  inputs = np.repeat(p.inputs, k, axis=0)
  labels = np.repeat(p.solutions, k, axis=0)
  moved = np.ones(len(inputs), bool)
  moved[::k] = False  # example 0 of each group is the original
  idx = np.flatnonzero(moved)
  for start in range(0, idx.size, 1 << 16):  # bounded memory for millions of rows
    rows = idx[start:start + (1 << 16)]
    t = random_transforms(rows.size, box, rng)
    inputs[rows], labels[rows] = t.apply(inputs[rows]), t.apply(labels[rows])
  return fmt.make_split(inputs, labels, np.full(len(p), k), box)


def _publish(out: str, splits: dict[str, fmt.Split], extra: dict, ratings: dict[str, np.ndarray]) -> str:
  """Write to a temporary sibling, then rename into place (local) or write directly (remote)."""
  fs, base = fsspec.core.url_to_fs(out)
  if not isinstance(fs, LocalFileSystem):
    _write_ratings(out, ratings)
    fmt.write(out, splits, extra)  # jaxpod.json last: its presence marks a complete folder
    return out
  tmp = f"{base}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
  try:
    _write_ratings(tmp, ratings)
    fmt.write(tmp, splits, extra)
    os.makedirs(os.path.dirname(base) or ".", exist_ok=True)
    os.rename(tmp, base)
  except OSError:
    if not _matches(out, extra["config"]):
      raise
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  return out


def _matches(out: str, config: dict) -> bool:
  """True when out holds a complete dataset built from exactly this config."""
  fs, base = fsspec.core.url_to_fs(out)
  paths = [f"{base}/{s}/all__{f}.npy" for s in fmt.SPLITS for f in fmt.FIELDS]
  paths += [f"{base}/{s}/dataset.json" for s in fmt.SPLITS] + [f"{base}/identifiers.json"]
  if not fs.exists(f"{base}/jaxpod.json") or not all(fs.exists(p) for p in paths):
    return False
  with fs.open(f"{base}/jaxpod.json") as f:
    return json.load(f).get("config") == config


def _reuse_or_refuse(out: str, config: dict) -> bool:
  fs, base = fsspec.core.url_to_fs(out)
  if _matches(out, config):
    return True
  if fs.exists(base) and fs.ls(base):
    raise FileExistsError(f"--out {out} already holds something else (another config or a partial build); "
                          "pick a new folder or delete it")
  return False


def build(cfg: SudokuDataConfig, out: str) -> str:
  """Generate the dataset described by cfg into out (reused when already built); returns out."""
  config = {"kind": "generated", "version": FORMAT_VERSION, **dataclasses.asdict(cfg)}
  if _reuse_or_refuse(out, config):
    return out
  box = Box.parse(cfg.box)
  seen: set[bytes] = set()
  train = _distinct(cfg.train, cfg, box, 0, seen)
  test = _distinct(cfg.test, cfg, box, 1, seen) if cfg.test else None
  rng = np.random.default_rng((cfg.seed, 2))
  splits = {"train": augmented_split(train, box, cfg.aug, rng)}
  test_p = test if test is not None else train.take(np.arange(0))
  splits["test"] = augmented_split(test_p, box, 0, rng)
  _publish(out, splits, {"box": str(box), "config": config}, {"train": train.ratings, "test": test_p.ratings})
  return out


def _write_ratings(out: str, ratings: dict[str, np.ndarray]) -> None:
  fs, base = fsspec.core.url_to_fs(out)
  for split, r in ratings.items():
    fs.makedirs(f"{base}/{split}", exist_ok=True)
    with fs.open(f"{base}/{split}/ratings.npy", "wb") as f:
      np.save(f, np.asarray(r, np.int32))


def ensure_dataset(cfg: SudokuDataConfig, cache_root: str | None = None) -> str:
  """The dataset folder for cfg in the cache, built first if missing (safe to call on every host)."""
  return build(cfg, cache_path(cfg, cache_root))


def import_csv(csv_path: str, out: str, *, test_csv: str | None = None, test_fraction: float = 0.1,
               aug: int = 0, seed: int = 0, subsample: int | None = None, min_rating: int = 0) -> str:
  """Sudoku-Extreme CSV file(s) -> dataset folder. Without test_csv, a seeded test_fraction of
  the rows is held out (rows as given: not checked against augmentations of the others)."""
  if not 0.0 <= test_fraction < 1.0:
    raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction}")
  config = {"kind": "csv", "version": FORMAT_VERSION, "csv": csv_path, "test_csv": test_csv,
            "test_fraction": test_fraction, "aug": aug, "seed": seed, "subsample": subsample, "min_rating": min_rating}
  if _reuse_or_refuse(out, config):
    return out
  rng = np.random.default_rng(seed)
  rows = read_csv(csv_path)
  box = rows.box
  train = Puzzles(rows.inputs, rows.solutions, rows.ratings)
  if test_csv is not None:
    t = read_csv(test_csv, box)
    test = Puzzles(t.inputs, t.solutions, t.ratings)
  else:
    order = rng.permutation(len(train))
    n_test = int(round(len(train) * test_fraction))
    train, test = train.take(np.sort(order[n_test:])), train.take(np.sort(order[:n_test]))
  train = train.take(np.flatnonzero(train.ratings >= min_rating))
  if subsample is not None and subsample < len(train):
    train = train.take(np.sort(rng.choice(len(train), subsample, replace=False)))
  splits = {"train": augmented_split(train, box, aug, rng), "test": augmented_split(test, box, 0, rng)}
  _publish(out, splits, {"box": str(box), "config": config}, {"train": train.ratings, "test": test.ratings})
  return out
