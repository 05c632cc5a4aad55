"""Start-up: `init()` / `shutdown()`: CPU simulation, jax.distributed, compile cache, host-prefixed logs.

`init` is idempotent and must run before anything touches a JAX backend (even
`jax.devices()`), because the CPU device count and the distributed client are fixed then.
The state it sets lives in `jaxpod.runtime.state`, which control and program_check read:
imports run start-up -> control/program_check -> state, never back.
"""
from __future__ import annotations

import ipaddress
import sys

from jaxpod.runtime import compile_cache, control, program_check, watchdog
from jaxpod.runtime.hosts import HostInfo
from jaxpod.runtime.log import get_logger, setup_logging
from jaxpod.runtime.state import (STATE, RuntimeConfig, cache_dir, config, host_info,  # noqa: F401 - re-exported
                                  in_multi_process_job, is_initialized, is_leader)

log = get_logger("runtime")


def _configure_cpu(host: HostInfo, cfg: RuntimeConfig) -> None:
  import jax
  platform = cfg.platform or ("cpu" if host.simulated else None)
  if platform:
    jax.config.update("jax_platforms", platform)
  if platform == "cpu" or host.simulated:
    jax.config.update("jax_num_cpu_devices", host.devices_per_host or 1)
    if host.multi_process:
      jax.config.update("jax_cpu_collectives_implementation", "gloo")


def _is_loopback(address: str) -> bool:
  """Whether a "host:port" coordinator address is on this machine's loopback interface."""
  name = address.rsplit(":", 1)[0].strip("[]")
  try:
    return name == "localhost" or ipaddress.ip_address(name).is_loopback
  except ValueError:
    return False


def _start_distributed(host: HostInfo, cfg: RuntimeConfig) -> None:
  import jax
  heartbeat = cfg.heartbeat_timeout_s or (5 if host.simulated else 30)
  shutdown = cfg.shutdown_timeout_s or (15 if host.simulated else 120)
  kwargs = dict(initialization_timeout=cfg.init_timeout_s, heartbeat_timeout_seconds=heartbeat,
                shutdown_timeout_seconds=shutdown)
  if host.source in ("config", "jaxpod-launch"):
    kwargs.update(coordinator_address=host.coordinator, num_processes=host.process_count,
                  process_id=host.process_index)
    if _is_loopback(host.coordinator):  # all hosts on this machine: listen on loopback, not JAX's default [::]
      kwargs.update(coordinator_bind_address=host.coordinator)
  try:
    jax.distributed.initialize(**kwargs)
  except Exception as e:
    hint = ("is another job using that port? pick a free one" if host.is_leader else
            "is the leader (host 0) running and reachable?")
    raise RuntimeError(f"[{host.label()}] could not join the coordination service at {host.coordinator} "
                       f"({type(e).__name__}: {str(e).splitlines()[0][:300]}); {hint}") from e


def init(cfg: RuntimeConfig | None = None, runs_dir: str | None = None) -> HostInfo:
  """Join the job: CPU simulation, distributed init, compile cache, logging. Idempotent."""
  if STATE.host is not None:
    return STATE.host
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
  STATE.host, STATE.config = host, cfg
  STATE.cache_dir = compile_cache.setup(cfg.compile_cache, runs_dir, host.is_leader)
  if host.multi_process:
    _install_excepthook()
    watchdog.arm(cfg, host.process_index)  # the calling thread's progress marks count from here
  program_check.enable(cfg.program_check or program_check.env_enabled())
  log.debug("initialised: %s, %d local / %d global devices", host.source, jax.local_device_count(),
            jax.device_count())
  return host


def _install_excepthook() -> None:
  """Publish an uncaught exception to the other hosts before the interpreter exits."""
  previous = sys.excepthook

  def hook(exc_type, exc, tb):
    control.abort(exc)
    previous(exc_type, exc, tb)

  sys.excepthook = hook


def shutdown() -> None:
  """Leave the job (a barrier with every host, by JAX's design). Safe to call twice."""
  if STATE.host is None:
    return
  import jax
  watchdog.disarm()  # leaving the job waits on the others (a barrier): not a stall
  if STATE.cache_dir:  # every host: each reads the shared cache, only process 0 writes it
    log.info("%s (%s)", compile_cache.STATS.summary(), STATE.cache_dir)
  if STATE.host.multi_process:
    jax.distributed.shutdown()
  STATE.host = None
