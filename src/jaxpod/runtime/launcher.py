"""Run a command as N simulated hosts (processes) on this machine.

Each host gets the variables `runtime.init()` reads (coordinator, host count and index,
devices per host), every output line is prefixed with its host and kept in a per-host log,
and the first host to exit non-zero takes the others down: SIGTERM, then SIGKILL after a
grace period (JAX installs a SIGTERM handler for preemption notices, so SIGTERM alone does
not stop a JAX process). The summary names the first host that failed and its last lines, and first the host the watchdogs named
(`runtime.watchdog`: a stuck host with its phase and where it was, or the host whose failure the others exited on),
whichever host exited first.

Hosts are isolated by default (DESIGN.md invariant 8): each gets a private local root
`<hosts_root>/host_<i>/` holding its own HOME, TMPDIR, XDG cache folder and working directory,
like a VM of a pod with its own disk, so code that assumes a shared local disk fails here as it
would there. `shared_local_disk=True` (`--shared-local-disk`) keeps one working directory and
HOME for all hosts and tells jaxpod the local disk is shared (an NFS or gcsfuse mount), through
`JAXPOD_SHARED_LOCAL_DISK=1`.
"""
from __future__ import annotations

import collections
import dataclasses
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TextIO

from jaxpod.runtime import hosts as hosts_lib

TAIL_LINES = 20


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
  """Options of `jaxpod launch`."""

  hosts: int = 2  # number of simulated hosts (processes)
  devices_per_host: int = 1  # fake CPU devices per host
  log_dir: str | None = None  # folder for host_<i>.log files; default: a new temporary folder
  port: int | None = None  # coordinator port on 127.0.0.1; default: a free one
  grace_s: float = 5.0  # seconds between SIGTERM and SIGKILL when stopping hosts
  timeout_s: float | None = None  # stop everything after this many seconds (None: no limit)
  shared_local_disk: bool = False  # hosts share HOME, TMPDIR and working dir (declare an NFS/gcsfuse setup)
  hosts_root: str | None = None  # parent of the private host_<i>/ roots; default: <log_dir>/hosts
  label: str = ""  # prefix of every echoed line, e.g. "trainer " -> "[trainer host 0/2]" (several clusters at once)

  def __post_init__(self):
    if self.hosts < 1:
      raise ValueError(f"--hosts must be >= 1, got {self.hosts}")
    if self.devices_per_host < 1:
      raise ValueError(f"--devices-per-host must be >= 1, got {self.devices_per_host}")
    if self.port is not None and not 0 < self.port < 65536:
      raise ValueError(f"--port must be in 1..65535, got {self.port}")
    if self.grace_s < 0:
      raise ValueError(f"--grace-s must be >= 0, got {self.grace_s}")
    for name in ("log_dir", "hosts_root"):
      value = getattr(self, name)
      if value and "://" in value:  # pathlib would make a local folder named "gs:"
        raise ValueError(f"--{name.replace('_', '-')} {value}: the hosts' logs and private disks are local to this "
                         "machine; give a local folder (copy the logs to a bucket afterwards if needed)")


@dataclasses.dataclass
class LaunchResult:
  """What happened to every host."""

  returncode: int  # 0 if every host exited 0, else the first failure's code
  exit_codes: list[int | None]  # per host (negative: killed by that signal)
  first_failed: int | None  # index of the first host that failed, if any
  output: list[list[str]]  # every line each host printed (stdout and stderr merged)
  log_dir: str
  seconds: float
  reason: str = ""  # why the launch failed: "exit", "timeout", "interrupted"

  def host_output(self, i: int) -> str:
    return "\n".join(self.output[i])

  @property
  def all_output(self) -> str:
    return "\n".join(f"[host {i}] {line}" for i, lines in enumerate(self.output) for line in lines)


def free_port() -> int:
  """A TCP port on 127.0.0.1 that is free right now."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def check_port_free(port: int) -> None:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    try:
      s.bind(("127.0.0.1", port))
    except OSError:
      raise ValueError(f"--port {port} is in use on 127.0.0.1; pick another port or omit --port") from None


def host_root(hosts_root: str, i: int) -> Path:
  """Private local root of simulated host i: home/, tmp/ and work/ (its working directory)."""
  root = Path(hosts_root) / f"host_{i}"
  for sub in ("home", "tmp", "work"):
    (root / sub).mkdir(parents=True, exist_ok=True)
  return root


def _isolate(env: dict, root: Path) -> None:
  home, tmp = str(root / "home"), str(root / "tmp")
  env.update({"HOME": home, "TMPDIR": tmp, "TMP": tmp, "TEMP": tmp, "XDG_CACHE_HOME": f"{home}/.cache",
              "XDG_CONFIG_HOME": f"{home}/.config", "XDG_DATA_HOME": f"{home}/.local/share",
              hosts_lib.ENV_LOCAL_ROOT: str(root)})
  env.pop(hosts_lib.ENV_SHARED_LOCAL_DISK, None)


def _program_paths_absolute(cmd: list[str]) -> list[str]:
  """The program (and a Python script) as absolute paths: the code is installed on every host alike,
  but each isolated host starts in its own empty working directory."""
  out = list(cmd)
  if os.sep in out[0] and not os.path.isabs(out[0]):  # ./run.sh, .venv/bin/python (a bare name is on PATH)
    out[0] = os.path.abspath(out[0])
  if len(out) > 1 and Path(out[0]).name.startswith("python") and os.path.isfile(out[1]):
    out[1] = os.path.abspath(out[1])
  return out


def host_env(i: int, n: int, coordinator: str, devices_per_host: int, base: dict | None = None,
             root: Path | None = None) -> dict:
  """Environment of simulated host i (private HOME/TMPDIR/caches under `root` unless the disk is shared)."""
  env = dict(os.environ if base is None else base)
  if root is not None:
    _isolate(env, root)
  else:
    env[hosts_lib.ENV_SHARED_LOCAL_DISK] = "1"
  env.update({
      hosts_lib.ENV_COORDINATOR: coordinator,
      hosts_lib.ENV_NUM_PROCESSES: str(n),
      hosts_lib.ENV_PROCESS_ID: str(i),
      hosts_lib.ENV_DEVICES_PER_HOST: str(devices_per_host),
      "JAX_PLATFORMS": "cpu",
      "PYTHONUNBUFFERED": "1",
  })
  return env


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
  try:
    os.killpg(proc.pid, sig)
  except (ProcessLookupError, PermissionError):
    pass


class _Host:
  def __init__(self, i: int, n: int, proc: subprocess.Popen, log_path: Path, sink: TextIO | None, lock,
               label: str = ""):
    self.i, self.proc, self.lines = i, proc, []
    self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    self._prefix = f"[{label}host {i}/{n}] "
    self._thread = threading.Thread(target=self._pump, args=(log_path, sink, lock), daemon=True)
    self._thread.start()

  def _pump(self, log_path: Path, sink: TextIO | None, lock) -> None:
    with open(log_path, "w", encoding="utf-8") as log:
      for raw in self.proc.stdout:
        line = raw.decode("utf-8", "replace").rstrip("\n")
        self.lines.append(line)
        self.tail.append(line)
        log.write(line + "\n")
        log.flush()
        if sink is not None:
          with lock:
            sink.write(self._prefix + line + "\n")
            sink.flush()

  def join(self, timeout: float = 5.0) -> None:
    self._thread.join(timeout)


def _stop_all(procs: list[_Host], grace_s: float) -> None:
  for h in procs:
    if h.proc.poll() is None:
      _signal_group(h.proc, signal.SIGTERM)
  end = time.monotonic() + grace_s
  while time.monotonic() < end and any(h.proc.poll() is None for h in procs):
    time.sleep(0.05)
  for h in procs:
    if h.proc.poll() is None:
      _signal_group(h.proc, signal.SIGKILL)
  for h in procs:
    h.proc.wait()


def launch(cmd: list[str], cfg: LaunchConfig, sink: TextIO | None = sys.stdout, env: dict | None = None,
           summary: TextIO | None = sys.stderr, echo_hosts: set[int] | None = None,
           stop: threading.Event | None = None) -> LaunchResult:
  """Run `cmd` as cfg.hosts simulated hosts; fail fast; return every host's outcome.

  Lines of the hosts in `echo_hosts` (default: all) are echoed to `sink`; all are logged. Setting
  `stop` (from another thread, e.g. a second cluster's launch) stops every host like a failure would.
  """
  if not cmd:
    raise ValueError("jaxpod launch needs a command after '--', e.g. jaxpod launch --hosts 2 -- jaxpod doctor")
  port = cfg.port if cfg.port is not None else free_port()
  if cfg.port is not None:
    check_port_free(port)
  log_dir = Path(cfg.log_dir or tempfile.mkdtemp(prefix="jaxpod-launch-"))
  log_dir.mkdir(parents=True, exist_ok=True)
  coordinator = f"127.0.0.1:{port}"
  lock = threading.Lock()
  start = time.monotonic()
  procs: list[_Host] = []
  # One folder per launch holds the logs and the hosts' private disks, so nothing else piles up in /tmp.
  hosts_root = None if cfg.shared_local_disk else (cfg.hosts_root or str(log_dir / "hosts"))
  if hosts_root is not None:
    cmd = _program_paths_absolute(cmd)
  for i in range(cfg.hosts):
    root = host_root(hosts_root, i) if hosts_root is not None else None
    try:
      p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                           env=host_env(i, cfg.hosts, coordinator, cfg.devices_per_host, env, root),
                           cwd=str(root / "work") if root is not None else None, start_new_session=True)
    except FileNotFoundError:
      _stop_all(procs, 0)
      raise ValueError(f"command not found: {cmd[0]!r}; check the command after '--'") from None
    echo = sink if echo_hosts is None or i in echo_hosts else None
    procs.append(_Host(i, cfg.hosts, p, log_dir / f"host_{i}.log", echo, lock, cfg.label))

  first_failed, reason = None, ""
  try:
    while True:
      codes = [h.proc.poll() for h in procs]
      bad = [h.i for h, c in zip(procs, codes) if c not in (None, 0)]
      if bad and first_failed is None:
        first_failed, reason = bad[0], "exit"
        _stop_all(procs, cfg.grace_s)
        break
      if all(c is not None for c in codes):
        break
      if cfg.timeout_s is not None and time.monotonic() - start > cfg.timeout_s:
        reason = "timeout"
        _stop_all(procs, cfg.grace_s)
        break
      if stop is not None and stop.is_set():
        reason = "stopped"
        _stop_all(procs, cfg.grace_s)
        break
      time.sleep(0.02)
  except KeyboardInterrupt:
    reason = "interrupted"
    _stop_all(procs, min(cfg.grace_s, 2.0))
  for h in procs:
    h.join()
  codes = [h.proc.returncode for h in procs]
  if reason == "exit":
    rc = codes[first_failed]
    rc = 128 - rc if rc < 0 else rc
  elif reason == "timeout":
    rc = 124
  elif reason in ("interrupted", "stopped"):
    rc = 130
  else:
    rc = 0
  result = LaunchResult(rc, codes, first_failed, [h.lines for h in procs], str(log_dir),
                        time.monotonic() - start, reason)
  if summary is not None:
    summary.write(format_summary(result, procs) + "\n")
    summary.flush()
  return result


def watchdog_line(result: LaunchResult) -> str | None:
  """The host the hosts' watchdogs named (`runtime.watchdog`), whichever host exited first: the line a stuck host
  printed about itself ("host i made no progress for N s in <phase>, at <file:line>"), else the failure notice a
  host left waiting exited on ("host i failed: ..."); None if no watchdog spoke."""
  from jaxpod.runtime.watchdog import NOTICE
  stuck = re.compile(re.escape(NOTICE) + r"(host \d+ made no progress for .*)$")
  waited = re.compile(re.escape(NOTICE) + r"host \d+ exits: (host \d+ failed.*); it was in ")
  for pattern in (stuck, waited):
    for lines in result.output:
      for line in lines:
        m = pattern.match(line)
        if m:
          return m.group(1)
  return None


def format_summary(result: LaunchResult, procs: list[_Host]) -> str:
  n = len(procs)
  if result.reason == "":
    return f"jaxpod launch: all {n} hosts exited 0 in {result.seconds:.1f}s; logs in {result.log_dir}"
  named = watchdog_line(result)
  if named is not None:
    return f"jaxpod launch: {named}\n" + _failure_summary(result, procs)
  return _failure_summary(result, procs)


def _failure_summary(result: LaunchResult, procs: list[_Host]) -> str:
  n = len(procs)
  if result.reason == "exit":
    h = procs[result.first_failed]
    tail = "\n".join(f"    {line}" for line in h.tail)
    return (f"jaxpod launch: host {h.i}/{n} failed first (exit code {result.exit_codes[h.i]}) after "
            f"{result.seconds:.1f}s; the other hosts were stopped. Last lines of host {h.i}:\n{tail}\n"
            f"  full logs: {result.log_dir}")
  what = {"timeout": "timed out", "stopped": "was stopped"}.get(result.reason, "was interrupted")
  return f"jaxpod launch: {what} after {result.seconds:.1f}s; all hosts stopped; logs in {result.log_dir}"
