"""The TRM benchmarks: `jaxpod bench trm-step` (`step.py`) and `jaxpod bench trm-parity` (`parity.py`), each beside
the reference PyTorch TRM run in its own process (`reference.py`; `compare.py` alternates the two step workers)."""
