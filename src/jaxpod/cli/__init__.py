"""Command line: parse config, call one workload; nothing else."""
