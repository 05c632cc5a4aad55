"""Run a policy's Python program in a sandboxed subprocess and say what happened, as text the policy reads.

    outcome = run_python("print(4821*7395)", SandboxLimits(timeout_s=2.0))
    outcome.observation                       # "35651295\n"; or "...[timeout after 2.0 s]\n", "[memory limit]\n", ...

Each call starts a fresh interpreter (`python -S -s -P`, the standard library only, no state kept between
calls) in a new scratch directory (its cwd, HOME and TMPDIR; deleted afterwards), with a minimal
environment (PATH, locale, PYTHONHASHSEED=0: never the parent's, so no proxies or credentials). The
program reads from nothing and its stdout and stderr go to files whose first `max_output_chars` come
back. Containment, in layers (`containment()` says which are active on this machine):

  namespaces   `unshare -rn --pid --fork --kill-child` (unprivileged user namespaces): a network namespace
               with no interface (no network, a kernel boundary) and a PID namespace whose init is the
               sandbox's first process (when it exits or is killed, the kernel kills every process the
               program made, even one that left the process group). Used when the probe succeeds.
  own /proc    `--mount-proc` with them (a mount namespace, private): a fresh /proc of the PID namespace, so
               the program sees its own processes only, not the machine's. The kernel refuses that mount in a
               user namespace when the machine's /proc is not fully visible (a container that masks paths of
               /proc, as Docker does by default); the namespaces then go without it, /proc lists the machine's
               processes, and only the audit hook's refusal to open or list what is outside the scratch
               directory and the standard library keeps the program from reading them.
  rlimits      set in the child before the program runs, soft = hard: RLIMIT_CPU (CPU seconds), RLIMIT_AS
               (memory: an allocation past it is a MemoryError), RLIMIT_FSIZE (file size: a write past it,
               stdout's included, ends the program by SIGXFSZ, which Python ignores unless told), RLIMIT_NOFILE,
               RLIMIT_NPROC (the uid's tasks now plus `max_processes`; the kernel does not apply it to root).
  process tree a new session; at the end (exit or `timeout_s` of wall time) SIGKILL to the whole process group,
               then every process that still carries this run's marker in its environment (/proc).
  audit hook   `sys.addaudithook` in the child before the program runs: refuses sockets, process creation
               (fork, exec, spawn, subprocess, kill), writes outside the scratch directory, reads outside it
               and the standard library, and importing ctypes and the like. A refusal is a PermissionError
               the program sees ("[network disabled]"). Not a security boundary: it guards honest mistakes
               and makes refusals readable; code that reaches C (a bug in the interpreter) bypasses it.
               Without namespaces it is the only network guard; writes have no kernel guard here (run the
               job as an unprivileged user, or in a container, for that).

Determinism: the observation is a function of the program text for programs that finish within the limits
and do not read the clock, the process id, os.urandom, the scratch path or the environment's marker
(hash seed 0, `random` seeded 0). Every host runs the tool itself (`rl.rollout.episodes` steps each host's
own copy of every episode's environment, and this layer has no control plane); a program near a time limit may
end differently on two hosts.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_child.py")  # what the subprocess runs
MARKER = "JAXPOD_SANDBOX_RUN"  # environment variable naming the run; the sweep kills processes that carry it


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
  """What one program may use; past a limit it is stopped and the observation says which limit."""

  timeout_s: float = 2.0  # wall-clock seconds before the whole process tree is killed
  cpu_s: int = 2  # CPU seconds (RLIMIT_CPU)
  memory_mb: int = 256  # address space per process in MiB (RLIMIT_AS)
  file_mb: int = 8  # largest file the program may write, MiB (RLIMIT_FSIZE)
  open_files: int = 32  # file descriptors (RLIMIT_NOFILE)
  max_processes: int = 8  # tasks over the uid's current count (RLIMIT_NPROC; not applied to root)
  max_output_chars: int = 256  # characters of stdout and stderr in the observation
  namespaces: bool = True  # network and PID namespaces when this machine allows them (`containment()`)

  def __post_init__(self):
    if not 0 < self.timeout_s <= 600:
      raise ValueError(f"sandbox timeout_s={self.timeout_s} must be in (0, 600]")
    for name in ("cpu_s", "memory_mb", "file_mb", "open_files", "max_processes", "max_output_chars"):
      if getattr(self, name) < 1:
        raise ValueError(f"sandbox {name}={getattr(self, name)} must be >= 1")
    if self.memory_mb < 64:
      raise ValueError(f"sandbox memory_mb={self.memory_mb} must be >= 64 (the interpreter needs ~30 MiB)")


@dataclasses.dataclass(frozen=True)
class Outcome:
  """What a run produced: its output (truncated), how it ended, and the observation the policy reads."""

  output: str  # stdout then stderr, at most max_output_chars (and "[output truncated]")
  status: str  # ok | error | timeout | cpu | memory | file_size | signal
  observation: str  # the output and a note on how it ended, or "[no output]"


UNSHARE = ("unshare", "-rn", "--pid", "--fork", "--kill-child")


def _runs(cmd: tuple[str, ...]) -> bool:
  try:
    return subprocess.run([*cmd, "true"], capture_output=True, timeout=10, env={"PATH": os.defpath}).returncode == 0
  except (OSError, subprocess.TimeoutExpired):
    return False


@functools.lru_cache(maxsize=1)
def _namespaces() -> tuple[str, ...]:
  """The `unshare` command that runs here: with `--mount-proc` if the kernel allows it, else without, else none
  (no root needed where user namespaces are on)."""
  if shutil.which("unshare") is None:
    return ()
  return next((cmd for cmd in ((*UNSHARE, "--mount-proc"), UNSHARE) if _runs(cmd)), ())


def containment(limits: SandboxLimits = SandboxLimits()) -> tuple[str, ...]:
  """The layers active for `limits` on this machine (see the module docstring)."""
  ns = _namespaces() if limits.namespaces else ()
  layers = (("namespaces",) if ns else ()) + (("own /proc",) if "--mount-proc" in ns else ())
  return layers + ("rlimits", "process tree", "audit hook")


def _uid_tasks() -> int:
  """Tasks (threads included) that this process's real uid runs now: RLIMIT_NPROC counts them all."""
  uid, count = os.getuid(), 0
  for pid in os.listdir("/proc"):
    if pid.isdigit():
      try:
        st = os.stat(f"/proc/{pid}/task")
        count += len(os.listdir(f"/proc/{pid}/task")) if st.st_uid == uid else 0
      except OSError:
        pass
  return count


def run_python(code: str, limits: SandboxLimits = SandboxLimits()) -> Outcome:
  """Run `code` in a fresh sandboxed interpreter (see the module docstring); never raises for what the code does."""
  token = secrets.token_hex(8)
  with tempfile.TemporaryDirectory(prefix="jaxpod-python-") as private:
    scratch = os.path.join(private, "scratch")
    os.mkdir(scratch, 0o700)
    out_path, err_path = os.path.join(private, "stdout"), os.path.join(private, "stderr")
    nproc = _uid_tasks() + limits.max_processes
    rl = [limits.cpu_s, limits.memory_mb << 20, limits.file_mb << 20, limits.open_files, nproc]
    ns = list(_namespaces()) if "namespaces" in containment(limits) else []
    cmd = [*ns, sys.executable, "-S", "-s", "-P", CHILD, *map(str, rl)]
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": scratch, "TMPDIR": scratch,
           "PYTHONHASHSEED": "0", "PYTHONIOENCODING": "utf-8", "PYTHONDONTWRITEBYTECODE": "1", MARKER: token}
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
      p = subprocess.Popen(cmd, cwd=scratch, env=env, stdin=subprocess.PIPE, stdout=out, stderr=err,
                           start_new_session=True, close_fds=True)
      timed_out = False
      try:
        p.communicate(code.encode("utf-8", "replace"), timeout=limits.timeout_s)
      except subprocess.TimeoutExpired:
        timed_out = True
      finally:
        _kill_tree(p, token)
    n = limits.max_output_chars
    stdout, stderr = _head(out_path, n), _head(err_path, n)
  return _outcome(stdout, stderr, p.returncode, timed_out, bool(ns), limits)


def _head(path: str, chars: int) -> tuple[str, bool]:
  """The first `chars` characters of a file, and whether there was more."""
  with open(path, "rb") as f:
    data = f.read(4 * chars + 4)
  text = data.decode("utf-8", "replace")
  return text[:chars], len(text) > chars or len(data) == 4 * chars + 4


def _kill_tree(p: subprocess.Popen, token: str) -> None:
  """SIGKILL the run's process group, reap it, then any process left with the run's marker (sweeps until none)."""
  try:
    os.killpg(p.pid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    pass
  p.wait()
  needle = f"{MARKER}={token}".encode()
  for sweep in range(10):  # a killed namespace takes a moment to go (its /proc is unmounted): wait up to ~1 s
    found = [pid for pid in live_processes() if needle in _environ(pid)]
    if not found:
      return
    for pid in found:
      try:
        os.kill(pid, signal.SIGKILL)
      except (ProcessLookupError, PermissionError):
        pass
    time.sleep(0.002 * 2 ** sweep)


def live_processes() -> list[int]:
  """Pids in /proc that are not zombies."""
  out = []
  for pid in os.listdir("/proc"):
    if pid.isdigit():
      try:
        with open(f"/proc/{pid}/stat", "rb") as f:
          state = f.read().rpartition(b")")[2].split()[0]
      except (OSError, IndexError):
        continue
      if state not in (b"Z", b"X"):
        out.append(int(pid))
  return out


def _environ(pid: int) -> bytes:
  try:
    with open(f"/proc/{pid}/environ", "rb") as f:
      return f.read()
  except OSError:
    return b""


def _outcome(stdout: tuple[str, bool], stderr: tuple[str, bool], rc: int, timed_out: bool, ns: bool,
             limits: SandboxLimits) -> Outcome:
  """Output and status from what the run left; the observation appends the status's note."""
  sig = -rc if rc < 0 else rc - 128 if ns and rc > 128 else 0  # the namespace's init reports a signal as 128+n
  last = stderr[0].rstrip("\n").rpartition("\n")[2]
  if timed_out:
    status, note = "timeout", f"[timeout after {float(limits.timeout_s)} s]"
  elif sig == signal.SIGXCPU or (sig == signal.SIGKILL and not timed_out):
    status, note = "cpu", f"[cpu limit: {limits.cpu_s} s]"
  elif sig == signal.SIGXFSZ:
    status, note = "file_size", f"[file size limit: {limits.file_mb} MiB]"
  elif last.startswith("MemoryError"):
    status, note = "memory", f"[memory limit: {limits.memory_mb} MiB]"
  elif sig:
    status, note = "signal", f"[killed by {signal.Signals(sig).name}]" if sig in signal.valid_signals() else "[killed]"
  else:
    status, note = ("error" if rc else "ok"), ""
  text = stdout[0] + stderr[0]
  output = text[:limits.max_output_chars] + ("[output truncated]\n" if stdout[1] or stderr[1]
                                              or len(text) > limits.max_output_chars else "")
  if note and output and not output.endswith("\n"):
    output += "\n"
  observation = output + (note + "\n" if note else "")
  return Outcome(output, status, observation or "[no output]\n")
