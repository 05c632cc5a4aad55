"""One simulated host running one jitted sum across hosts, where host 0's trace of it takes SLOW_S seconds (a
long compile on one host: the others found the program in the cache, or compile faster) and the stall limit is
shorter than that:

    python slow_compile_worker.py STALL_TIMEOUT_S SLOW_S

Host 1 waits in the sum's collective for host 0 past its own limit; neither is stuck. Prints `SUM <value>` on each
host if the run ends.
"""
from __future__ import annotations

import sys
import time


def main(argv):
  from jaxpod import runtime
  stall_s, slow_s = float(argv[0]), float(argv[1])
  runtime.init(runtime.RuntimeConfig(stall_timeout_s=stall_s))
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import NamedSharding, PartitionSpec as P

  from jaxpod.runtime import make_mesh, progress
  mesh = make_mesh(data=-1)
  host = runtime.host_info().process_index
  sharding = NamedSharding(mesh, P("data"))
  x = jax.make_array_from_callback((jax.device_count(),), sharding, lambda idx: np.ones((1,), np.float32))

  def total(v):
    if host == 0:
      time.sleep(slow_s)  # inside the trace: host 0's main thread is in JAX's tracing all along
    return jnp.sum(v)

  progress.mark("the sum", step=True)
  out = jax.jit(total, out_shardings=NamedSharding(mesh, P()))(x)
  print("SUM", float(np.asarray(out.addressable_data(0))), flush=True)
  runtime.shutdown()


if __name__ == "__main__":
  main(sys.argv[1:])
