"""Sudoku data for TRM: generator, augmentation, reference on-disk format, CSV import, loader.

Trainer entry points: `ensure_dataset(SudokuDataConfig(...))` -> dataset folder;
`SudokuLoader(folder, global_batch_size, seed)` -> `.train_iter()` / `.eval_iter()`;
`validate_batch(...)` before JAX initialises.
"""
from jaxpod.data.sudoku.augment import augment, class_keys, random_transforms
from jaxpod.data.sudoku.build import SudokuDataConfig, build, cache_path, ensure_dataset, import_csv
from jaxpod.data.sudoku.csv import read_csv, write_csv
from jaxpod.data.sudoku.fmt import IGNORE, Split, read, read_box, write
from jaxpod.data.sudoku.generate import Puzzles, generate
from jaxpod.data.sudoku.grid import Box, agrees, is_solution
from jaxpod.data.sudoku.loader import SudokuLoader, make_global_batch, validate_batch
from jaxpod.data.sudoku.solver import solve
