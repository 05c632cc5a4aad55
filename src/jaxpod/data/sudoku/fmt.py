"""The reference (TinyRecursiveModels / HRM) on-disk puzzle format: writer and reader.

Layout of a dataset folder `<out>`:
  <out>/{train,test}/all__inputs.npy              uint8 [E, seq_len]  digit + 1; 1 = blank, 0 = pad
  <out>/{train,test}/all__labels.npy              uint8 [E, seq_len]  full solution, digit + 1
  <out>/{train,test}/all__puzzle_identifiers.npy  int32 [P]           0 for Sudoku (blank identifier)
  <out>/{train,test}/all__puzzle_indices.npy      int32 [P + 1]       examples of puzzle p: [pi[p], pi[p+1])
  <out>/{train,test}/all__group_indices.npy       int32 [G + 1]       puzzles of group g: [gi[g], gi[g+1])
  <out>/{train,test}/dataset.json                 the reference metadata keys
  <out>/identifiers.json                          ["<blank>"]
For Sudoku every example is its own puzzle (pi = 0..E) and a group is one source board with
its augmentations (the reference samples one puzzle per group per epoch). jaxpod adds
`jaxpod.json` (box shape, build config) and `{split}/ratings.npy` beside these; the
reference loader ignores both, and the reader here does not need them.
"""
from __future__ import annotations

import dataclasses
import io
import json

import fsspec
import numpy as np

from jaxpod.data.sudoku.grid import Box

SPLITS = ("train", "test")
FIELDS = ("inputs", "labels", "puzzle_identifiers", "puzzle_indices", "group_indices")
PAD_ID = 0
IGNORE_LABEL_ID = 0  # label value the reader turns into IGNORE (the reference's convention)
IGNORE = -100  # label used in batches for "no loss here"


@dataclasses.dataclass
class Split:
  """One split of a dataset, in stored encoding (digit + 1)."""

  inputs: np.ndarray  # uint8 [E, seq_len]
  labels: np.ndarray  # uint8 [E, seq_len]
  puzzle_identifiers: np.ndarray  # int32 [P]
  puzzle_indices: np.ndarray  # int32 [P + 1]
  group_indices: np.ndarray  # int32 [G + 1]
  metadata: dict  # dataset.json

  @property
  def num_groups(self) -> int:
    return len(self.group_indices) - 1

  def __len__(self) -> int:
    return len(self.inputs)


def encode(boards: np.ndarray) -> np.ndarray:
  """Digits (0 blank, 1..n) -> stored uint8 (1 blank, 2..n+1)."""
  return (np.asarray(boards).astype(np.int32) + 1).astype(np.uint8)


def decode(stored: np.ndarray) -> np.ndarray:
  """Stored uint8 -> digits int8 (pad and blank both -> 0)."""
  return np.maximum(np.asarray(stored).astype(np.int16) - 1, 0).astype(np.int8)


def metadata(box: Box, num_examples: int, num_groups: int) -> dict:
  """dataset.json contents for a Sudoku split (one example per puzzle, one identifier)."""
  return {
      "pad_id": PAD_ID,
      "ignore_label_id": IGNORE_LABEL_ID,
      "blank_identifier_id": 0,
      "vocab_size": box.n + 2,
      "seq_len": box.cells,
      "num_puzzle_identifiers": 1,
      "total_groups": num_groups,
      "mean_puzzle_examples": 1.0,
      "total_puzzles": num_examples,
      "sets": ["all"],
  }


def make_split(inputs: np.ndarray, labels: np.ndarray, group_sizes: np.ndarray, box: Box) -> Split:
  """A Split from digit boards grouped consecutively (`group_sizes[g]` boards in group g)."""
  e = len(inputs)
  if int(np.sum(group_sizes)) != e:
    raise ValueError(f"group sizes sum to {int(np.sum(group_sizes))} but there are {e} boards")
  return Split(
      inputs=encode(inputs), labels=encode(labels),
      puzzle_identifiers=np.zeros(e, np.int32),
      puzzle_indices=np.arange(e + 1, dtype=np.int32),
      group_indices=np.concatenate([[0], np.cumsum(group_sizes)]).astype(np.int32),
      metadata=metadata(box, e, len(group_sizes)))


def _save(fs, path: str, array: np.ndarray) -> None:
  buf = io.BytesIO()
  np.save(buf, array)
  with fs.open(path, "wb") as f:
    f.write(buf.getvalue())


def write(root: str, splits: dict[str, Split], extra: dict | None = None) -> None:
  """Write splits (and `jaxpod.json` = extra) under root, in the reference layout."""
  fs, base = fsspec.core.url_to_fs(root)
  for name, split in splits.items():
    fs.makedirs(f"{base}/{name}", exist_ok=True)
    for field in FIELDS:
      _save(fs, f"{base}/{name}/all__{field}.npy", getattr(split, field))
    with fs.open(f"{base}/{name}/dataset.json", "w") as f:
      json.dump(split.metadata, f, indent=2)
  with fs.open(f"{base}/identifiers.json", "w") as f:
    json.dump(["<blank>"], f)
  if extra is not None:
    with fs.open(f"{base}/jaxpod.json", "w") as f:
      json.dump(extra, f, indent=2, sort_keys=True)


def _load(fs, path: str) -> np.ndarray:
  if not fs.exists(path):
    raise FileNotFoundError(f"missing {path}: not a dataset folder in the reference layout (build one with `jaxpod data`)")
  with fs.open(path, "rb") as f:
    return np.load(io.BytesIO(f.read()), allow_pickle=False)


def read(root: str, split: str) -> Split:
  """Read one split ('train' or 'test') of a dataset folder written here or by the reference."""
  if split not in SPLITS:
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
  fs, base = fsspec.core.url_to_fs(root)
  meta_path = f"{base}/{split}/dataset.json"
  if not fs.exists(meta_path):
    raise FileNotFoundError(f"missing {meta_path}: not a dataset folder in the reference layout (build one with `jaxpod data`)")
  with fs.open(meta_path) as f:
    meta = json.load(f)
  sets = meta.get("sets", ["all"])
  if sets != ["all"]:
    raise ValueError(f"{meta_path}: sets must be ['all'] for Sudoku, got {sets}")
  arrays = {field: _load(fs, f"{base}/{split}/all__{field}.npy") for field in FIELDS}
  split_ = Split(**arrays, metadata=meta)
  _check(split_, meta_path)
  return split_


def _check(s: Split, where: str) -> None:
  seq = s.metadata["seq_len"]
  if s.inputs.ndim != 2 or s.inputs.shape[1] != seq or s.labels.shape != s.inputs.shape:
    raise ValueError(f"{where}: inputs {s.inputs.shape} / labels {s.labels.shape} do not match seq_len {seq}")
  if s.puzzle_indices[-1] != len(s.inputs) or s.group_indices[-1] != len(s.puzzle_identifiers):
    raise ValueError(f"{where}: puzzle_indices / group_indices do not cover the {len(s.inputs)} examples")
  if len(s.puzzle_indices) != len(s.puzzle_identifiers) + 1:
    raise ValueError(f"{where}: {len(s.puzzle_identifiers)} puzzle identifiers but {len(s.puzzle_indices) - 1} puzzles")


def read_box(root: str) -> Box:
  """Box shape of a dataset: from jaxpod.json if present, else the squarest box for seq_len."""
  fs, base = fsspec.core.url_to_fs(root)
  if fs.exists(f"{base}/jaxpod.json"):
    with fs.open(f"{base}/jaxpod.json") as f:
      return Box.parse(json.load(f)["box"])
  with fs.open(f"{base}/train/dataset.json") as f:
    seq = json.load(f)["seq_len"]
  return Box.for_side(int(round(seq**0.5)))
