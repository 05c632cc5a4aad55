"""Data layer: datasets and loaders for jaxpod workloads (Sudoku for TRM; text later)."""
