"""The trainer's view of the Sudoku data: build into a cache folder, per-host train and eval iterators.

Build (leader only, others wait through `broadcast_call`): puzzles from
`jaxpod.data.sudoku.generate`, split so that no test puzzle is a symmetry of a training
puzzle (canonical forms are compared, for grids small enough to enumerate their symmetries),
training puzzles augmented, written in the reference on-disk format
(`{train,test}/all__*.npy`, `dataset.json`, `identifiers.json`).

Iterators are grain datasets. Training: `range(N).shuffle(seed).repeat()` (reshuffled every
epoch), batched to the GLOBAL batch, and each host keeps its contiguous slice of every global
batch, so the global batch is the same for any host count. Its state (`get_state()`, JSON) is
checkpointed. Eval: the test set in order, last batch padded with rows whose labels are all
ignored (the model's metrics then skip them).
"""
from __future__ import annotations

import itertools
import json
import os
import shutil
from pathlib import Path

import numpy as np

from jaxpod.models.trm import IGNORE_LABEL_ID
from jaxpod.runtime.log import get_logger
from jaxpod.train.config import DataConfig

log = get_logger("train.data")
MAX_SYMMETRIES = 20000  # canonicalise only grids whose positional symmetry group is at most this large


# ---------------------------------------------------------------------------- symmetries
def _line_perms(groups: int, size: int) -> list[list[int]]:
  """Permutations of `groups` blocks of `size` lines and of the lines inside each block."""
  out = []
  for order in itertools.permutations(range(groups)):
    for inner in itertools.product(*[list(itertools.permutations(range(size)))] * groups):
      out.append([g * size + inner[i][k] for i, g in enumerate(order) for k in range(size)])
  return out


def positional_symmetries(rows: int, cols: int) -> np.ndarray | None:
  """int [T, n*n] cell permutations (bands, rows, stacks, columns, transpose when square); None if too many."""
  n = rows * cols
  count = (math_factorial(cols) * math_factorial(rows) ** cols) * (math_factorial(rows) * math_factorial(cols) ** rows)
  if count * (2 if rows == cols else 1) > MAX_SYMMETRIES:
    return None
  idx = np.arange(n * n).reshape(n, n)
  row_p, col_p = _line_perms(cols, rows), _line_perms(rows, cols)
  perms = [idx[np.ix_(rp, cp)].ravel() for rp in row_p for cp in col_p]
  if rows == cols:
    perms += [idx.T[np.ix_(rp, cp)].ravel() for rp in row_p for cp in col_p]
  return np.unique(np.asarray(perms), axis=0)


def math_factorial(k: int) -> int:
  out = 1
  for i in range(2, k + 1):
    out *= i
  return out


def canonical_keys(puzzles: np.ndarray, n: int, perms: np.ndarray, chunk: int = 128) -> list[bytes]:
  """A key per puzzle equal for two puzzles iff one is a symmetry (cells + digit relabelling) of the other."""
  keys = []
  for start in range(0, len(puzzles), chunk):
    x = puzzles[start:start + chunk][:, perms].astype(np.int64)  # [N, T, C]
    cells = x.shape[-1]
    first = np.full(x.shape[:2] + (n,), cells, np.int64)
    for d in range(1, n + 1):
      hit = x == d
      first[..., d - 1] = np.where(hit.any(-1), hit.argmax(-1), cells)
    rank = np.argsort(np.argsort(first, axis=-1, kind="stable"), axis=-1) + 1  # digit -> order of appearance
    lut = np.concatenate([np.zeros(first.shape[:2] + (1,), np.int64), rank], -1)
    y = np.take_along_axis(lut, x, -1)  # [N, T, C] relabelled
    per = 60 // max(1, int(n).bit_length())  # cells per int64 word
    words = [np.zeros(y.shape[:2], np.int64) for _ in range(0, cells, per)]
    for w, s in enumerate(range(0, cells, per)):
      for c in range(s, min(cells, s + per)):
        words[w] = words[w] * (n + 1) + y[..., c]
    alive = np.ones(y.shape[:2], bool)
    for w in words:  # lexicographic minimum over the T transforms
      m = np.where(alive, w, np.iinfo(np.int64).max).min(axis=1, keepdims=True)
      alive &= w == m
    best = alive.argmax(axis=1)
    keys += [np.stack([w[i, best[i]] for w in words]).tobytes() for i in range(len(y))]
  return keys


def augment(inputs: np.ndarray, labels: np.ndarray, rows: int, cols: int, rng: np.random.Generator):
  """One random symmetry per puzzle: digit permutation, transpose (square boxes), bands/rows, stacks/columns."""
  n = rows * cols
  idx = np.arange(n * n).reshape(n, n)
  out_i, out_l = np.empty_like(inputs), np.empty_like(labels)
  for k in range(len(inputs)):
    bands = rng.permutation(cols)
    row_order = [b * rows + r for b in bands for r in rng.permutation(rows)]
    stacks = rng.permutation(rows)
    col_order = [s * cols + c for s in stacks for c in rng.permutation(cols)]
    grid = idx.T if rows == cols and rng.random() < 0.5 else idx
    cell = grid[np.ix_(row_order, col_order)].ravel()
    digits = np.concatenate([[0], rng.permutation(n) + 1])
    out_i[k], out_l[k] = digits[inputs[k][cell]], digits[labels[k][cell]]
  return out_i, out_l


# ---------------------------------------------------------------------------- build
def _write_split(out: Path, name: str, inputs: np.ndarray, labels: np.ndarray, groups: np.ndarray, n: int):
  """Reference format: stored value = digit + 1 (0 pad, 1 blank), one identifier, group boundaries."""
  d = out / name
  d.mkdir(parents=True, exist_ok=True)
  count = len(inputs)
  np.save(d / "all__inputs.npy", (inputs + 1).astype(np.uint8))
  np.save(d / "all__labels.npy", (labels + 1).astype(np.uint8))
  np.save(d / "all__puzzle_identifiers.npy", np.zeros(count, np.int32))
  np.save(d / "all__puzzle_indices.npy", np.arange(count + 1, dtype=np.int32))
  np.save(d / "all__group_indices.npy", groups.astype(np.int32))
  meta = {"pad_id": 0, "ignore_label_id": 0, "blank_identifier_id": 0, "vocab_size": n + 2, "seq_len": n * n,
          "num_puzzle_identifiers": 1, "total_groups": len(groups) - 1, "mean_puzzle_examples": 1,
          "total_puzzles": count, "sets": ["all"]}
  (d / "dataset.json").write_text(json.dumps(meta))


def build(cfg: DataConfig, out_dir: str) -> str:
  """Generate, split (test never a symmetry of train), augment and write a dataset; returns `out_dir`."""
  from jaxpod.data.sudoku.generate import generate
  rows, cols = (int(p) for p in cfg.box.lower().split("x"))
  n = rows * cols
  perms = positional_symmetries(rows, cols)

  def keys_of(puzzles):
    return canonical_keys(puzzles.inputs, n, perms) if perms is not None else [p.tobytes() for p in puzzles.inputs]

  train = generate(cfg.num_train, cfg.box, seed=cfg.seed, clues=cfg.clues)
  seen = set(keys_of(train))
  test_parts, have = [], 0
  for round_ in range(1, 21):  # held-out puzzles: new symmetry classes only, from fresh seeds
    pool = generate(max(64, 2 * (cfg.num_test - have)), cfg.box, seed=cfg.seed * 1000 + round_, clues=cfg.clues)
    keep = []
    for i, key in enumerate(keys_of(pool)):
      if key not in seen and have + len(keep) < cfg.num_test:
        seen.add(key)  # test puzzles are distinct classes among themselves too
        keep.append(i)
    test_parts.append(pool.take(np.asarray(keep, np.intp)))
    have += len(keep)
    if have >= cfg.num_test:
      break
  if have < cfg.num_test:
    raise ValueError(f"data.num_test={cfg.num_test}: only {have} {cfg.box} puzzles are not symmetries of the "
                     f"{cfg.num_train} training puzzles; lower data.num_test or data.num_train, or raise data.clues")
  test = type(train).concat(test_parts)
  rng = np.random.default_rng(cfg.seed + 1)
  tr_in, tr_lab = train.inputs.astype(np.int64), train.solutions.astype(np.int64)
  copies_in, copies_lab = [tr_in], [tr_lab]
  for _ in range(cfg.augmentations):
    a_in, a_lab = augment(tr_in, tr_lab, rows, cols, rng)
    copies_in.append(a_in)
    copies_lab.append(a_lab)
  # group g = training puzzle g and its augmentations
  order = np.stack([np.arange(len(tr_in)) + k * len(tr_in) for k in range(len(copies_in))], 1).ravel()
  all_in, all_lab = np.concatenate(copies_in)[order], np.concatenate(copies_lab)[order]
  groups = np.arange(0, len(all_in) + 1, len(copies_in))
  tmp = Path(out_dir + ".tmp")
  shutil.rmtree(tmp, ignore_errors=True)
  _write_split(tmp, "train", all_in, all_lab, groups, n)
  te_in, te_lab = test.inputs.astype(np.int64), test.solutions.astype(np.int64)
  _write_split(tmp, "test", te_in, te_lab, np.arange(len(te_in) + 1), n)
  (tmp / "identifiers.json").write_text(json.dumps(["<blank>"]))
  os.replace(tmp, out_dir)
  log.info("built %s: %d train rows (%d puzzles x %d), %d held-out test puzzles", out_dir, len(all_in),
           len(tr_in), len(copies_in), len(te_in))
  return out_dir


def ensure_dataset(cfg: DataConfig) -> str:
  """The dataset folder, built first if it is missing (call on the leader)."""
  path = cfg.dataset_dir()
  if Path(path, "test", "dataset.json").is_file():
    return path
  if cfg.path:
    raise FileNotFoundError(f"data.path={cfg.path}: no test/dataset.json there; point it at a dataset folder")
  Path(path).parent.mkdir(parents=True, exist_ok=True)
  return build(cfg, path)


# ---------------------------------------------------------------------------- loading
def load_split(path: str, split: str) -> dict:
  """{inputs, labels, puzzle_identifiers} as int32 with ignored labels set to IGNORE_LABEL_ID."""
  d = Path(path, split)
  meta = json.loads((d / "dataset.json").read_text())
  inputs = np.load(d / "all__inputs.npy").astype(np.int32)
  labels = np.load(d / "all__labels.npy").astype(np.int32)
  labels = np.where(labels == meta["ignore_label_id"], IGNORE_LABEL_ID, labels)
  ids = np.load(d / "all__puzzle_identifiers.npy").astype(np.int32)
  return {"inputs": inputs, "labels": labels, "puzzle_identifiers": ids, "meta": meta}


def _host_slice(global_batch: int, host: int, hosts: int) -> slice:
  per = global_batch // hosts
  return slice(host * per, (host + 1) * per)


def train_iterator(split: dict, global_batch: int, seed: int, host: int, hosts: int):
  """A grain iterator of this host's rows of every global batch (checkpointable: get_state/set_state)."""
  import grain
  rows = _host_slice(global_batch, host, hosts)
  arrays = {k: split[k] for k in ("inputs", "labels", "puzzle_identifiers")}
  ds = (grain.MapDataset.range(len(arrays["inputs"])).shuffle(seed=seed).repeat().batch(global_batch)
        .map(lambda idx: {k: v[idx[rows]] for k, v in arrays.items()}))
  return iter(ds)


def eval_batches(split: dict, global_batch: int, host: int, hosts: int):
  """This host's rows of each global eval batch, in order; the last batch padded with ignored rows."""
  rows = _host_slice(global_batch, host, hosts)
  total = len(split["inputs"])
  for start in range(0, total, global_batch):
    batch = {}
    for k in ("inputs", "labels", "puzzle_identifiers"):
      v = split[k][start:start + global_batch]
      pad = global_batch - len(v)
      if pad:
        fill = IGNORE_LABEL_ID if k == "labels" else 0
        v = np.concatenate([v, np.full((pad,) + v.shape[1:], fill, v.dtype)])
      batch[k] = v[rows]
    yield batch
