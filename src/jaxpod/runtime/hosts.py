"""Who am I in the pod: `HostInfo`, known before JAX initialises.

Sources, in order: explicit config, the variables `jaxpod launch` sets, JAX's own cluster
detection (SLURM, Open MPI, TPU/GKE, Kubernetes), else a single process. Nothing here
touches a JAX backend, so configs can be validated against the host count first.
"""
from __future__ import annotations

import dataclasses
import os

# Variables set by `jaxpod launch` for each simulated host.
ENV_COORDINATOR = "JAXPOD_COORDINATOR"
ENV_NUM_PROCESSES = "JAXPOD_NUM_PROCESSES"
ENV_PROCESS_ID = "JAXPOD_PROCESS_ID"
ENV_DEVICES_PER_HOST = "JAXPOD_DEVICES_PER_HOST"
LAUNCH_VARS = (ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID)
ENV_LOCAL_ROOT = "JAXPOD_LOCAL_ROOT"  # an isolated simulated host's private root (set by jaxpod launch)
# "1": every host sees the same local disk (NFS, gcsfuse); local paths may then hold shared state.
ENV_SHARED_LOCAL_DISK = "JAXPOD_SHARED_LOCAL_DISK"


def shared_local_disk(env=None) -> bool:
  """True when the user (or `jaxpod launch --shared-local-disk`) declared the local disk shared by all hosts."""
  return (os.environ if env is None else env).get(ENV_SHARED_LOCAL_DISK, "").lower() in ("1", "true", "yes")


@dataclasses.dataclass(frozen=True)
class HostInfo:
  """This process's place in the job, decided before any JAX backend exists."""

  process_index: int = 0  # 0-based index of this host (JAX process)
  process_count: int = 1  # number of hosts in the job
  coordinator: str | None = None  # "host:port" of the coordination service; None for one process
  devices_per_host: int | None = None  # fake CPU devices per process when simulated
  source: str = "single"  # where this came from: config | jaxpod-launch | <cluster name> | single
  simulated: bool = False  # True when hosts are processes on one machine (CPU simulation)

  def __post_init__(self):
    if self.process_count < 1:
      raise ValueError(f"HostInfo.process_count must be >= 1, got {self.process_count} (from {self.source})")
    if not 0 <= self.process_index < self.process_count:
      raise ValueError(
          f"HostInfo.process_index must be in [0, {self.process_count}), got {self.process_index} "
          f"(from {self.source}); check the process id / rank variables")
    if self.process_count > 1 and not self.coordinator and self.source in ("config", "jaxpod-launch"):
      raise ValueError(f"{self.process_count} hosts need a coordinator address (from {self.source})")
    if self.devices_per_host is not None and self.devices_per_host < 1:
      raise ValueError(f"devices_per_host must be >= 1, got {self.devices_per_host}")

  @property
  def is_leader(self) -> bool:
    """The leader (process 0) writes shared things: logs, metrics, manifests."""
    return self.process_index == 0

  @property
  def multi_process(self) -> bool:
    return self.process_count > 1

  def label(self) -> str:
    """Prefix used in logs: `host 2/4`."""
    return f"host {self.process_index}/{self.process_count}"


def _int_env(env, name: str) -> int:
  raw = env.get(name)
  try:
    return int(raw)
  except (TypeError, ValueError):
    raise ValueError(f"environment variable {name}={raw!r} is not an integer; unset it or fix it") from None


def _from_launch_env(env) -> HostInfo | None:
  present = [v for v in LAUNCH_VARS if v in env]
  if not present:
    return None
  missing = [v for v in LAUNCH_VARS if v not in env]
  if missing:
    raise ValueError(
        f"incomplete jaxpod launch variables: {', '.join(present)} set but {', '.join(missing)} missing; "
        "run under `jaxpod launch` or unset them")
  dph = _int_env(env, ENV_DEVICES_PER_HOST) if env.get(ENV_DEVICES_PER_HOST) else None
  return HostInfo(
      process_index=_int_env(env, ENV_PROCESS_ID),
      process_count=_int_env(env, ENV_NUM_PROCESSES),
      coordinator=env[ENV_COORDINATOR],
      devices_per_host=dph,
      source="jaxpod-launch",
      simulated=True,
  )


def _from_jax_clusters() -> HostInfo | None:
  """JAX's own cluster detection; only environments that need no network are queried here."""
  try:
    from jax._src import clusters  # private, but it is what jax.distributed.initialize uses
  except ImportError:  # pragma: no cover - jax missing
    return None
  for cluster in clusters.ClusterEnv._cluster_types:  # noqa: SLF001
    name = cluster.__name__
    # GCE TPU VMs are found through the metadata server (network); JAX resolves those itself
    # in initialize(). We only report them here when their variables say so.
    if name.startswith("GceTpu") or name == "MpiCluster":
      continue
    try:
      present = cluster.is_env_present()
    except Exception:  # a detector that cannot run here is simply absent
      present = False
    if not present:
      continue
    try:
      count, index = cluster.get_process_count(), cluster.get_process_id()
    except Exception as e:
      raise ValueError(f"{name} environment detected but unreadable ({type(e).__name__}: {e}); "
                       "fix the cluster variables or pass runtime.num_processes/process_id explicitly") from e
    return HostInfo(process_index=index, process_count=count, coordinator=None,
                    source=name.removesuffix("Cluster").lower() or name)
  return None


def detect_hosts(process_id: int | None = None, num_processes: int | None = None,
                 coordinator: str | None = None, devices_per_host: int | None = None,
                 env=None) -> HostInfo:
  """Resolve HostInfo from explicit values, then launcher variables, then cluster detection."""
  env = os.environ if env is None else env
  explicit = [x is not None for x in (process_id, num_processes)]
  if any(explicit):
    if not all(explicit):
      raise ValueError("runtime.process_id and runtime.num_processes must be given together")
    return HostInfo(process_index=process_id, process_count=num_processes, coordinator=coordinator,
                    devices_per_host=devices_per_host, source="config",
                    simulated=devices_per_host is not None)
  info = _from_launch_env(env)
  if info is not None:
    if devices_per_host is not None:
      info = dataclasses.replace(info, devices_per_host=devices_per_host)
    return info
  info = _from_jax_clusters()
  if info is not None:
    return info
  return HostInfo(devices_per_host=devices_per_host, simulated=devices_per_host is not None)


def validate_divisible(field: str, value: int, hosts: HostInfo, per: str = "host") -> None:
  """Raise a one-line error if `value` does not split evenly over the hosts."""
  if value % hosts.process_count:
    raise ValueError(
        f"{field}={value} is not divisible by the {hosts.process_count} hosts; "
        f"use a multiple of {hosts.process_count} (each {per} takes an equal share)")
