"""Process state of the runtime: how this process joins the job (`RuntimeConfig`) and what it joined.

The bottom of the runtime: control, program_check and the start-up module
(`jaxpod.runtime.distributed`) read this state; only the start-up module writes it.
"""
from __future__ import annotations

import dataclasses

from jaxpod.runtime import compile_cache
from jaxpod.runtime.hosts import HostInfo, detect_hosts


@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
  """How this process joins the job; defaults run here as one process or under `jaxpod launch`."""

  num_processes: int | None = None  # explicit host count (else: launcher variables / cluster detection)
  process_id: int | None = None  # explicit host index, given together with num_processes
  coordinator: str | None = None  # explicit "host:port" of the coordination service
  devices_per_host: int | None = None  # fake CPU devices per process (CPU simulation); None: launcher's or 1
  platform: str | None = None  # force a JAX platform ("cpu"); None: JAX's choice (cpu under jaxpod launch)
  heartbeat_timeout_s: int | None = None  # dead-host detection; None: 5 s simulated, 30 s on real clusters
  shutdown_timeout_s: int | None = None  # how long shutdown waits for peers; None: 15 s simulated, 120 s real
  init_timeout_s: int = 120  # how long to wait for every host to join
  control_timeout_s: float = 600.0  # default deadline of barriers/broadcasts/allgathers
  stall_timeout_s: float | None = None  # a host without progress this long is stuck (watchdog); None: max(600 s, 10 x longest step)
  compile_timeout_s: float = 3600.0  # how long one trace + XLA compile may take before the watchdog calls the host stuck
  program_check: bool = False  # compare lowered programs across hosts before running them (or JAXPOD_PROGRAM_CHECK=1)
  log_level: str = "INFO"  # jaxpod logger level
  compile_cache: compile_cache.CompileCacheConfig = dataclasses.field(
      default_factory=compile_cache.CompileCacheConfig)  # persistent XLA cache

  def __post_init__(self):
    for name in ("heartbeat_timeout_s", "shutdown_timeout_s"):
      v = getattr(self, name)
      if v is not None and v < 1:
        raise ValueError(f"runtime.{name}={v} must be >= 1 second")
    if self.init_timeout_s < 1:
      raise ValueError(f"runtime.init_timeout_s={self.init_timeout_s} must be >= 1")
    if self.control_timeout_s <= 0:
      raise ValueError(f"runtime.control_timeout_s={self.control_timeout_s} must be > 0")
    for name in ("stall_timeout_s", "compile_timeout_s"):
      v = getattr(self, name)
      if v is not None and v <= 0:
        raise ValueError(f"runtime.{name}={v} must be > 0 seconds (a stuck host is found after it)")

  def hosts(self) -> HostInfo:
    """HostInfo without initialising JAX (for early validation)."""
    return detect_hosts(self.process_id, self.num_processes, self.coordinator, self.devices_per_host)


@dataclasses.dataclass
class _State:
  """Set by `distributed.init`, cleared by `distributed.shutdown`."""

  host: HostInfo | None = None
  config: RuntimeConfig | None = None
  cache_dir: str | None = None


STATE = _State()


def is_initialized() -> bool:
  """True between `init()` and `shutdown()`."""
  return STATE.host is not None


def host_info() -> HostInfo:
  """This process's HostInfo (after init), or what detection says (before)."""
  return STATE.host if STATE.host is not None else detect_hosts()


def in_multi_process_job() -> bool:
  """True once init() has joined a job of several processes (the control plane is live)."""
  return STATE.host is not None and STATE.host.multi_process


def is_leader() -> bool:
  """True on host 0."""
  return host_info().is_leader


def config() -> RuntimeConfig:
  """The RuntimeConfig given to `init()` (defaults before)."""
  return STATE.config or RuntimeConfig()


def cache_dir() -> str | None:
  """The persistent compile cache folder in use, if any."""
  return STATE.cache_dir
