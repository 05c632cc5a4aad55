"""Benchmarks behind `jaxpod bench ...`: each prints a table, writes JSON, and compares with a
named baseline measured in the same run (ratios and medians; these machines are noisy)."""
