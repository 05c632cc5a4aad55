"""Shared by the test process and the worker processes: the test model, its layouts, digests.

numpy only at import time (the test process never imports jax for this)."""
from __future__ import annotations

import hashlib

import ml_dtypes
import numpy as np

CHUNK_BYTES = 64 << 10  # arrow_flight chunk in tests; "big" below spans several chunks and streams
STREAM_BYTES = 128 << 10


def leaves(node) -> list:
  """The arrays of a nested dict/list pytree, in order (no JAX import in the agents)."""
  if isinstance(node, dict):
    return [x for v in node.values() for x in leaves(v)]
  if isinstance(node, (list, tuple)):
    return [x for v in node for x in leaves(v)]
  return [node]


def make_params(seed: int) -> dict:
  """A nested pytree of numpy arrays: fp32, bf16, int32, and one parameter larger than a chunk."""
  rng = np.random.default_rng(seed)
  return {
      "embed": {"w": rng.standard_normal((64, 32), np.float32)},
      "layers": [{"w": rng.standard_normal((32, 32)).astype(ml_dtypes.bfloat16),
                  "b": rng.standard_normal(32).astype(np.float32)} for _ in range(2)],
      "step": (np.arange(8, dtype=np.int32) * seed),
      "big": rng.standard_normal((128, 512), np.float32),  # 256 KiB: 4 chunks, 2 streams
  }


def digest(tree: dict) -> dict[str, str]:
  """name -> sha256 of dtype, shape and bytes, for every leaf."""
  out = {}

  def walk(prefix, node):
    if isinstance(node, dict):
      for k, v in node.items():
        walk(f"{prefix}{k}/", v)
    elif isinstance(node, (list, tuple)):
      for i, v in enumerate(node):
        walk(f"{prefix}{i}/", v)
    else:
      a = np.ascontiguousarray(np.asarray(node))
      h = hashlib.sha256(f"{a.dtype.name}{a.shape}".encode())
      h.update(a.tobytes())
      out[prefix.rstrip("/")] = h.hexdigest()
  walk("", tree)
  return out


def specs(role: str) -> dict:
  """PartitionSpec tuples per leaf: trainer on a (4,) mesh "x", client on a (2, 2) mesh "a","b"."""
  if role == "trainer":
    return {"embed": {"w": ("x", None)}, "layers": [{"w": (None, "x"), "b": ()}] * 2, "step": (),
            "big": ("x", None)}
  return {"embed": {"w": (None, "b")}, "layers": [{"w": ("a", None), "b": ("b",)}] * 2, "step": (),
          "big": ("b", "a")}


def mesh(jax, role: str):
  """The role's mesh over this process's 4 fake CPU devices."""
  auto = jax.sharding.AxisType.Auto
  if role == "trainer":
    return jax.make_mesh((4,), ("x",), axis_types=(auto,))
  return jax.make_mesh((2, 2), ("a", "b"), axis_types=(auto, auto))


def shardings(jax, role: str, tree: dict):
  """NamedShardings of `tree`'s leaves for the role."""
  m = mesh(jax, role)
  P = jax.sharding.PartitionSpec
  return jax.tree_util.tree_map(lambda _, s: jax.sharding.NamedSharding(m, P(*s)), tree, specs(role),
                                is_leaf=lambda x: isinstance(x, tuple))


def signal(sync_dir: str, mode: str, event: str) -> None:
  """Drop `<mode>.<event>` in sync_dir (jobs launched side by side tell each other where they are)."""
  import os
  with open(os.path.join(sync_dir, f"{mode}.{event}"), "w"):
    pass


def wait_for(sync_dir: str, mode: str, event: str, timeout_s: float = 90.0) -> None:
  """Wait until `<mode>.<event>` exists in sync_dir; raise naming it at the deadline."""
  import os
  import time
  path = os.path.join(sync_dir, f"{mode}.{event}")
  deadline = time.monotonic() + timeout_s
  while not os.path.exists(path):
    if time.monotonic() > deadline:
      raise TimeoutError(f"{path} did not appear within {timeout_s}s (did the other job fail?)")
    time.sleep(0.02)
