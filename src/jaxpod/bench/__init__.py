"""Benchmarks behind `jaxpod bench ...`: each prints a table, writes JSON, and compares with a
named baseline measured in the same run (ratios and medians; these machines are noisy).

One package (a wing) per workload measured; `jaxpod bench W` is `W/command.py`, `jaxpod bench W-X` is `W/X.py`;
a wing's other modules are its sub-modes and the processes it starts. What several wings use is in `common.py`."""
