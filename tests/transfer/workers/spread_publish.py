"""A 2-host trainer whose parameters are replicated across hosts (run by `jaxpod launch`).

argv: folder. Mesh (2, 2) = ("data" over the hosts, "fsdp" within a host): every parameter is
replicated across the two hosts, as an 8B model trained data=8 x fsdp=4 is. Every host publishes
version 1 through `PublishWeightsHook(background=True)` (checkpoint mode, the folder a bucket),
prints `VISIBLE <bool>` (whether version 1 was committed when the hook returned: it must not be,
the upload is off the step), runs a jitted step that donates the params (+1), then the hook commits
version 1 and uploads version 2 at its next call, and `close` commits version 2. Each publish
prints `SERVED <seq> <bytes>`: the bytes this host put on the wire.
"""
from __future__ import annotations

import sys

from jaxpod import runtime

runtime.init()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

from jaxpod import transfer  # noqa: E402
from jaxpod.transfer.hooks import PublishWeightsHook  # noqa: E402

SHAPES = {"embed": (512, 64), "mlp": (64, 256), "out": (256, 64), "norm": (64,), "bias": (256,)}
SPECS = {"embed": P("fsdp", None), "mlp": P(None, "fsdp"), "out": P("fsdp", None), "norm": P(), "bias": P()}


def expected(step: int) -> dict:
  """The params after `step` train steps (the test process computes the same)."""
  rng = np.random.default_rng(0)
  return {k: rng.standard_normal(s).astype(np.float32) + step for k, s in SHAPES.items()}


def main() -> None:
  folder = sys.argv[1]
  mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("data", "fsdp"))
  host = expected(0)
  params = {k: jax.make_array_from_callback(v.shape, NamedSharding(mesh, SPECS[k]), lambda i, v=v: v[i])
            for k, v in host.items()}
  cfg = transfer.TransferConfig(mode="checkpoint", folder=folder, keep_n=2)
  hook = PublishWeightsHook(cfg, every=1, background=True)
  hook(1, params)
  print(f"VISIBLE {hook.server.coord.latest() is not None}", flush=True)
  step = jax.jit(lambda p: jax.tree_util.tree_map(lambda x: x + 1, p), donate_argnums=0)
  params = jax.block_until_ready(step(params))  # the donated buffers are reused: the snapshot is not
  hook(2, params)
  hook.close()
  for m in hook.history:
    print(f"SERVED {m['seq']} {m['bytes']}", flush=True)


if __name__ == "__main__":
  main()
