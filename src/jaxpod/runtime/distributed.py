"""`init()` / `shutdown()`: CPU simulation, jax.distributed, compile cache, host-prefixed logs.

`init` is idempotent and must run before anything touches a JAX backend (even
`jax.devices()`), because the CPU device count and the distributed client are fixed then.
"""
from __future__ import annotations

import dataclasses
import sys

from jaxpod.runtime import compile_cache
from jaxpod.runtime.hosts import HostInfo, detect_hosts
from jaxpod.runtime.log import get_logger, setup_logging

log = get_logger("runtime")


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
  program_check: bool = False  # compare lowered program hashes across hosts before running them
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

  def hosts(self) -> HostInfo:
    """HostInfo without initialising JAX (for early validation)."""
    return detect_hosts(self.process_id, self.num_processes, self.coordinator, self.devices_per_host)


@dataclasses.dataclass
class _State:
  host: HostInfo | None = None
  config: RuntimeConfig | None = None
  cache_dir: str | None = None


_STATE = _State()


def is_initialized() -> bool:
  return _STATE.host is not None


def host_info() -> HostInfo:
  """This process's HostInfo (after init), or what detection says (before)."""
  return _STATE.host if _STATE.host is not None else detect_hosts()


def in_multi_process_job() -> bool:
  """True once init() has joined a job of several processes (the control plane is live)."""
  return _STATE.host is not None and _STATE.host.multi_process


def is_leader() -> bool:
  return host_info().is_leader


def config() -> RuntimeConfig:
  return _STATE.config or RuntimeConfig()


def cache_dir() -> str | None:
  """The persistent compile cache folder in use, if any."""
  return _STATE.cache_dir


def _configure_cpu(host: HostInfo, cfg: RuntimeConfig) -> None:
  import jax
  platform = cfg.platform or ("cpu" if host.simulated else None)
  if platform:
    jax.config.update("jax_platforms", platform)
  if platform == "cpu" or host.simulated:
    jax.config.update("jax_num_cpu_devices", host.devices_per_host or 1)
    if host.multi_process:
      jax.config.update("jax_cpu_collectives_implementation", "gloo")


def _start_distributed(host: HostInfo, cfg: RuntimeConfig) -> None:
  import jax
  heartbeat = cfg.heartbeat_timeout_s or (5 if host.simulated else 30)
  shutdown = cfg.shutdown_timeout_s or (15 if host.simulated else 120)
  kwargs = dict(initialization_timeout=cfg.init_timeout_s, heartbeat_timeout_seconds=heartbeat,
                shutdown_timeout_seconds=shutdown)
  if host.source in ("config", "jaxpod-launch"):
    kwargs.update(coordinator_address=host.coordinator, num_processes=host.process_count,
                  process_id=host.process_index)
  try:
    jax.distributed.initialize(**kwargs)
  except Exception as e:
    hint = ("is another job using that port? pick a free one" if host.is_leader else
            "is the leader (host 0) running and reachable?")
    raise RuntimeError(f"[{host.label()}] could not join the coordination service at {host.coordinator} "
                       f"({type(e).__name__}: {str(e).splitlines()[0][:300]}); {hint}") from e


def init(cfg: RuntimeConfig | None = None, runs_dir: str | None = None) -> HostInfo:
  """Join the job: CPU simulation, distributed init, compile cache, logging. Idempotent."""
  if _STATE.host is not None:
    return _STATE.host
  cfg = cfg or RuntimeConfig()
  host = cfg.hosts()
  _configure_cpu(host, cfg)
  if host.multi_process:
    _start_distributed(host, cfg)
  import jax
  if jax.process_count() != host.process_count or jax.process_index() != host.process_index:
    raise RuntimeError(f"JAX reports process {jax.process_index()}/{jax.process_count()} but jaxpod expected "
                       f"{host.process_index}/{host.process_count} (from {host.source})")
  setup_logging(host.label(), cfg.log_level)
  _STATE.host, _STATE.config = host, cfg
  _STATE.cache_dir = compile_cache.setup(cfg.compile_cache, runs_dir, host.is_leader)
  if host.multi_process:
    _install_excepthook()
  from jaxpod.runtime import program_check
  program_check.enable(cfg.program_check)
  log.debug("initialised: %s, %d local / %d global devices", host.source, jax.local_device_count(),
            jax.device_count())
  return host


def _install_excepthook() -> None:
  """Publish an uncaught exception to the other hosts before the interpreter exits."""
  previous = sys.excepthook

  def hook(exc_type, exc, tb):
    from jaxpod.runtime import control
    control.abort(exc)
    previous(exc_type, exc, tb)

  sys.excepthook = hook


def shutdown() -> None:
  """Leave the job (a barrier with every host, by JAX's design). Safe to call twice."""
  if _STATE.host is None:
    return
  import jax
  if _STATE.cache_dir:  # every host: each reads the shared cache, only process 0 writes it
    log.info("%s (%s)", compile_cache.STATS.summary(), _STATE.cache_dir)
  if _STATE.host.multi_process:
    jax.distributed.shutdown()
  _STATE.host = None
