"""`local_cluster()`: a one-machine Ray cluster that listens on 127.0.0.1 only.

    with ray_local.local_cluster(num_cpus=1, include_dashboard=False) as address:
      subprocess.run([...], env=dict(os.environ))   # children join with ray.init(address=address)

Why not plain `ray.init()`: Ray (checked on 2.60) starts a local cluster on the machine's network
address with its GCS, raylet, object manager and worker servers listening on every interface,
and it maps `_node_ip_address="127.0.0.1"` back to the network address. Its single-machine mode
(the one it uses on Windows and macOS), chosen by RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, gives the
node the address 127.0.0.1, and then every Ray server binds loopback. A process that joins must
be in that mode too (else it maps 127.0.0.1 to the network address and cannot connect), so the
variable is set in this process's environment while the cluster runs: children inherit it.
After start, the addresses Ray reports are checked, and a cluster on any other address is shut
down with an error rather than used.

Ray's own token authentication still applies (on by default for local clusters since Ray 2.59:
the token is in ~/.ray/auth_token, or RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH). For a Ray cluster
that spans machines, which jaxpod does not start, set RAY_AUTH_MODE=token and the same token
(`ray get-auth-token --generate`) on every node.
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator

from jaxpod.runtime.extras import require
from jaxpod.transfer.secrets import is_loopback

LOCAL_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def addresses() -> list[str]:
  """Host parts of the connected Ray cluster's GCS address and of every node's address."""
  import ray
  hosts = [ray.get_runtime_context().gcs_address.rsplit(":", 1)[0]]
  return hosts + [node["NodeManagerAddress"] for node in ray.nodes()]


@contextlib.contextmanager
def local_cluster(**init_kwargs) -> Iterator[str]:
  """Start a Ray cluster on this machine bound to 127.0.0.1, yield its GCS address, shut it down."""
  if "address" in init_kwargs:
    raise ValueError("local_cluster() starts a new cluster; to join one use ray.init(address=...)")
  ray = require("ray", "a local Ray cluster")
  from ray._private import ray_constants  # Ray read the variable when it was imported
  saved_env, saved_flag = os.environ.get(LOCAL_ONLY_ENV), ray_constants.ENABLE_RAY_CLUSTER
  os.environ[LOCAL_ONLY_ENV] = "0"
  ray_constants.ENABLE_RAY_CLUSTER = False
  try:
    ray.init(_node_ip_address="127.0.0.1", **init_kwargs)
    try:
      found = addresses()
      if not all(is_loopback(h) for h in found):
        raise RuntimeError(f"Ray started on {sorted(set(found))}, not 127.0.0.1 (this Ray version ignores "
                           f"{LOCAL_ONLY_ENV}=0); refusing a cluster reachable from the network")
      yield ray.get_runtime_context().gcs_address
    finally:
      ray.shutdown()
  finally:
    ray_constants.ENABLE_RAY_CLUSTER = saved_flag
    if saved_env is None:
      os.environ.pop(LOCAL_ONLY_ENV, None)
    else:
      os.environ[LOCAL_ONLY_ENV] = saved_env
