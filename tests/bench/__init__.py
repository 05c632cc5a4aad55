"""Tests of the benchmarks' layout (jaxpod.bench); each wing's own tests live beside its workload's."""
