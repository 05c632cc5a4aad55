"""Sudoku data for TRM: generator, augmentation, reference on-disk format, CSV import, loader.

Trainer entry points:
  validate_batch(global_batch_size, hosts, data_parallel)   before JAX initialises
  path = ensure_dataset(SudokuDataConfig(box="2x3", ...))    built once into the cache, then reused
  loader = SudokuLoader(path, global_batch_size, seed=0)     this host's rows (jax.process_index)
  loader.train_iter(num_steps) / loader.eval_iter()          grain iterators of numpy dicts
  make_global_batch(batch, sharding)                         host rows -> global jax.Arrays
"""
from jaxpod.data.sudoku.augment import augment, class_keys, random_transforms
from jaxpod.data.sudoku.build import SudokuDataConfig, build, cache_path, ensure_dataset, import_csv
from jaxpod.data.sudoku.csv import read_csv, write_csv
from jaxpod.data.sudoku.fmt import IGNORE, Split, read, read_box, write
from jaxpod.data.sudoku.generate import Puzzles, generate
from jaxpod.data.sudoku.grid import Box, agrees, is_solution
from jaxpod.data.sudoku.loader import SudokuLoader, make_global_batch, validate_batch
from jaxpod.data.sudoku.solver import solve
