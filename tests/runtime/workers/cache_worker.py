"""Compiles one function with the persistent cache in argv[1]; prints `CACHE hits misses`."""
import sys

from jaxpod import runtime
from jaxpod.runtime import compile_cache

runtime.init(runtime.RuntimeConfig(compile_cache=runtime.CompileCacheConfig(dir=sys.argv[1], min_compile_time_s=0)))
import jax
import jax.numpy as jnp


@jax.jit
def step(x):
  for _ in range(4):
    x = jnp.tanh(x @ x.T) @ x
  return x.sum()


step(jnp.ones((32, 32))).block_until_ready()
print("CACHE", compile_cache.STATS.hits, compile_cache.STATS.misses, flush=True)
runtime.barrier("cache.end", 60)
