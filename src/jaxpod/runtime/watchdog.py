"""The progress watchdog: a thread on every host of a multi-host job, so that a host alive but stuck is named and
nothing waits for it forever (invariant 3).

The control plane names a host that raises or dies; it cannot name one whose Python waits on something that
never returns (a storage read, a deadlocked loader, a user's reward function): its heartbeat keeps the
coordination service content, and the others sit in the step's device collective, which has no timeout and
never reaches a control-plane call. So every host runs this thread (armed by `runtime.init`), which:

- ends its own host when the main thread made no progress (`runtime.progress` marks: each train step and hook,
  each rollout round, each engine round, each export wave) for the stall limit: it writes every thread's stack
  to the host's log, publishes "host i made no progress for N s in <phase>, at <file:line>" as this host's
  failure notice on the control plane, prints it as one `jaxpod watchdog:` line and exits 1. Hosts in step
  pass their limits together (a host that waits in a collective for the stuck one marked its last progress a
  moment later), so a host past its limit first says so (`jaxpod/stalled/<i>`, with the time of its last
  progress), waits VERDICT_WAIT_S for the others past theirs, and the one whose progress is oldest is named: it
  reports as above (host 0, which runs the coordination service, a few seconds after the others), the others
  publish its notice and exit as below;
- ends its host when another host published a failure notice (a stall, or an exception: a failure inside an
  export or a reshard leaves the others in a collective too) and the main thread, which would raise
  `PeerFailed` at its next control-plane call, has not ended the process within PEER_GRACE_S: it prints the
  notice and exits 1. The thread reads the notices while the main thread is inside a device collective (the
  coordination client releases the GIL).

The stall limit is `runtime.stall_timeout_s`, or by default the larger of STALL_FLOOR_S (600 s, the control
plane's default deadline) and STEP_FACTOR (10) times the longest step seen so far (train steps; intervals that
held a compile do not count). It is raised inside blocks that may legitimately take longer without a mark: a
control-plane call waits up to its own deadline (a dataset the leader prepares for an hour is waited for by the
others with that deadline), and a compile, told apart by the main thread's stack (a frame of JAX's trace,
lowering or compile modules, `COMPILE_FILES`), may take `runtime.compile_timeout_s` (3600 s); the end of a
trace or compile (JAX's compile events) counts as progress. A host compiling for longer than half its stall
limit says so on the control plane (`jaxpod/busy/<i>`, once per such compile): a host past its own limit
meanwhile (in the collective of that program, on a host that found it in the compile cache or compiled faster)
waits for it instead of calling itself stuck, so one host's long compile is no false alarm on another. A host
whose main thread is waiting inside JAX
(a device result, a collective) gets WAIT_SLACK times the limit: the host it waits for, whose last mark is
older, is then the one that reports, whatever each host measured its steps as. One process has no peers to
hang: the watchdog runs only in multi-process jobs.
"""
from __future__ import annotations

import atexit
import json
import os
import sys
import sysconfig
import threading
import time
import traceback

from jaxpod.runtime import control, kv, progress, state
from jaxpod.runtime.log import get_logger

log = get_logger("watchdog")
NOTICE = "jaxpod watchdog: "  # the prefix of the lines it prints (the launcher's summary quotes a stall's)
STALL_FLOOR_S = 600.0  # the default limit's floor: the control plane's default deadline
STEP_FACTOR = 10.0  # the default limit is at least this many times the longest step
WAIT_SLACK = 1.5  # a host waiting inside JAX reports only after this times its limit (the stuck host goes first)
POLL_S = 1.0  # how often the thread looks at the marks and at the others' notices (one KV read each time)
PEER_GRACE_S = 2.0  # time a main thread gets to end the process itself once another host's notice is out
VERDICT_WAIT_S = POLL_S + 0.5  # a host past its limit waits this long for the others past theirs, then names one
COMPILE_FILES = ("jax/_src/compiler.py", "jax/_src/interpreters/mlir.py", "jax/_src/interpreters/partial_eval.py")
_SUSPECTS = f"{control.PREFIX}/stalled"  # the hosts past their limit, with the time of their last progress
_BUSY = f"{control.PREFIX}/busy"  # hosts in a compile longer than half their stall limit, until when it may last
_STDLIB = tuple({sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]})


class Stalled(RuntimeError):
  """This host made no progress for the stall limit (published to the others as its failure)."""


def default_limit_s(longest_step_s: float) -> float:
  """The stall limit when `runtime.stall_timeout_s` is not set."""
  return max(STALL_FLOOR_S, STEP_FACTOR * longest_step_s)


def limit_s(cfg: state.RuntimeConfig, p: progress.Progress) -> float:
  """The stall limit now: the configured or default one, raised by the `progress.allow` blocks the main thread is
  in."""
  base = cfg.stall_timeout_s if cfg.stall_timeout_s is not None else default_limit_s(p.longest_step_s)
  return max(base, *p.allowances) if p.allowances else base


def _frames(frame) -> list:
  """The frames of a stack, innermost first."""
  out = []
  while frame is not None:
    out.append(frame)
    frame = frame.f_back
  return out


def _path(frame) -> str:
  return frame.f_code.co_filename.replace(os.sep, "/")


def where(frames: list) -> str:
  """`file:line (function)` of the innermost frame outside the standard library (a threading wait says less than
  the code that waits), site-packages left out of the path."""
  own = next((f for f in frames if not f.f_code.co_filename.startswith(_STDLIB)), frames[0] if frames else None)
  if own is None:
    return "an unknown place"
  return f"{_path(own).split('site-packages/')[-1]}:{own.f_lineno} ({own.f_code.co_name})"


def compiling(frames: list) -> bool:
  """Whether a stack is inside JAX's tracing, lowering or XLA compile."""
  return any(_path(f).endswith(COMPILE_FILES) for f in frames)


def waiting(frames: list) -> bool:
  """Whether a stack waits inside JAX (a device result, a transfer, a collective) or in the trainer's wait."""
  own = next((f for f in frames if not f.f_code.co_filename.startswith(_STDLIB)), None)
  return own is not None and ("/jax/_src/" in _path(own) or own.f_code.co_name == "wait_ready")


def thread_stacks() -> str:
  """Every thread's stack, the main one first, as traceback text."""
  names = {t.ident: t.name for t in threading.enumerate()}
  frames = sys._current_frames()
  order = sorted(frames, key=lambda ident: ident != progress.STATE.owner)
  parts = []
  for ident in order:
    tag = " (main: the one marking progress)" if ident == progress.STATE.owner else ""
    parts.append(f"Thread {names.get(ident, ident)}{tag}:\n" + "".join(traceback.format_stack(frames[ident])))
  return "\n".join(parts)


class Watchdog:
  """The thread (see the module docstring); `start` once after the job is joined, `stop` before leaving it."""

  def __init__(self, cfg: state.RuntimeConfig, host_index: int):
    self.cfg, self.host = cfg, host_index
    self._stop = threading.Event()
    self._peer_seen: float | None = None
    self._busy: float | None = None  # the last progress (monotonic) of the silence this host published as busy
    self._deferred: set[int] = set()  # busy hosts this host's wait was last put down to (said once each)
    self.longest: tuple = (0.0, "", 0.0, "")  # longest time without progress seen: its phase, limit, why that limit
    self.longest_outside_compile: tuple = (0.0, "", 0.0, "")  # the same, the main thread not compiling
    self._thread = threading.Thread(target=self._run, name="jaxpod-watchdog", daemon=True)

  def start(self) -> None:
    self._thread.start()

  def stop(self) -> None:
    self._stop.set()
    if self._thread.is_alive() and self._thread is not threading.current_thread():
      self._thread.join()
    for what, (gap, phase, limit, why) in (("", self.longest), (" outside a compile", self.longest_outside_compile)):
      log.info("watchdog: the longest time without progress%s was %.0f s, in %s (%s; the limit then: %.0f s)",
               what, gap, phase or "-", why or "no compile, no wait", limit)

  def _run(self) -> None:
    while not self._stop.wait(POLL_S):
      self._check_peers()
      self._check_stall()

  def _main_frames(self) -> list:
    return _frames(sys._current_frames().get(progress.STATE.owner))

  def _check_peers(self) -> None:
    try:
      control.check_peers()
    except control.PeerFailed as e:
      now = time.monotonic()
      self._peer_seen = self._peer_seen or now
      if now - self._peer_seen >= PEER_GRACE_S and not self._stop.is_set():
        p = progress.STATE
        self._exit(f"host {self.host} exits: {e}; it was in {p.phase}, at {where(self._main_frames())}")
    except Exception as e:  # noqa: BLE001 - the service may be gone; JAX's heartbeat handles that
      log.debug("could not read the failure notices: %s", e)

  def _check_stall(self) -> None:
    p = progress.STATE
    last = p.last
    stalled = time.monotonic() - last
    if self._busy is not None and self._busy != last:  # progress since it said it was busy
      self._unbusy()
    base = limit_s(self.cfg, progress.Progress(longest_step_s=p.longest_step_s))  # without allowed blocks
    limit = limit_s(self.cfg, p)
    if stalled < 2 * POLL_S:
      return
    frames = self._main_frames()
    why = "allowed block" if limit > base else ""
    if compiling(frames):
      limit, why = max(limit, self.cfg.compile_timeout_s), "compiling"
    elif waiting(frames):
      limit, why = limit * WAIT_SLACK, "waiting inside JAX"
    if stalled > self.longest[0]:
      self.longest = (stalled, p.phase, limit, why)
    if why != "compiling" and stalled > self.longest_outside_compile[0]:
      self.longest_outside_compile = (stalled, p.phase, limit, why)
    if stalled <= base / 2:
      return
    if why == "compiling" and self._busy is None:
      self._publish_busy(last, time.time() - stalled + limit, p.phase)
    if stalled <= limit or self._stop.is_set():
      return
    message = f"host {self.host} made no progress for {stalled:.0f} s in {p.phase}, at {where(frames)}"
    stuck = self._verdict(message, time.time() - stalled)
    if self._stop.is_set():  # the process is leaving the job after all
      return
    if stuck is None:  # a host this one waits for is compiling (or in an allowed block): not a stall yet
      return
    if stuck["host"] != self.host:  # a host it waited for made no progress for longer: that one is named
      control.publish_failure(stuck["host"], Stalled.__name__, stuck["message"])
      self._stop.wait(PEER_GRACE_S)  # the stuck host goes down first
      self._exit(f"host {self.host} exits: host {stuck['host']} failed: {Stalled.__name__}: {stuck['message']}; "
                 f"it was in {p.phase}, at {where(frames)}")
    sys.stderr.write(f"{NOTICE}stacks of every thread of host {self.host}:\n{thread_stacks()}\n")
    control.abort(Stalled(message))
    self._say(message)
    if self.host == 0:  # the coordination service runs here: the others read the notice and go first
      self._stop.wait(POLL_S + PEER_GRACE_S + 0.5)
    os._exit(1)

  def _verdict(self, message: str, last_progress: float) -> dict | None:
    """The host to name among those past their limit now: the one whose last progress is oldest (hosts in step
    reach their limits together, a host waiting in a collective for the stuck one a moment later). None when
    another host is compiling past the time it would be stuck otherwise (`_BUSY`) and not past its compile limit:
    this host waits for it (in the collective of the program that host compiles, or the one after), and that
    host reports itself if it stays silent past its limit."""
    mine = {"host": self.host, "last": last_progress, "message": message}
    try:
      busy = self._busy_peers()
      if busy:
        self._defer(busy)
        return None
      kv.set(f"{_SUSPECTS}/{self.host}", json.dumps(mine), overwrite=True)
      self._stop.wait(VERDICT_WAIT_S)  # the others past their limit in this poll publish theirs
      busy = self._busy_peers()
      if busy:
        kv.delete(f"{_SUSPECTS}/{self.host}")
        self._defer(busy)
        return None
      suspects = [json.loads(v) for _, v in kv.dir_get(_SUSPECTS)]
    except Exception as e:  # noqa: BLE001 - the service is gone: this host can only speak for itself
      log.debug("could not compare with the other hosts: %s", e)
      return mine
    return min(suspects, key=lambda r: (r["last"], r["host"]))

  def _publish_busy(self, last: float, until: float, phase: str) -> None:
    """Tell the others this host is compiling, so silent but not stuck, until `until` (wall time): a host waiting
    for it in a device collective must not call itself stuck meanwhile. Written once per long compile: rare."""
    try:
      kv.set(f"{_BUSY}/{self.host}", json.dumps({"host": self.host, "until": until, "phase": f"{phase}, compiling"}),
             overwrite=True)
      self._busy = last
    except Exception as e:  # noqa: BLE001 - the service may be gone; JAX's heartbeat handles that
      log.debug("could not say this host is busy: %s", e)

  def _unbusy(self) -> None:
    try:
      kv.delete(f"{_BUSY}/{self.host}")
    except Exception as e:  # noqa: BLE001
      log.debug("could not clear this host's busy notice: %s", e)
    self._busy = None

  def _busy_peers(self) -> list[dict]:
    now = time.time()
    notes = [json.loads(v) for _, v in kv.dir_get(_BUSY)]
    return [n for n in notes if n["host"] != self.host and n["until"] > now]

  def _defer(self, busy: list[dict]) -> None:
    hosts = {n["host"] for n in busy}
    if not hosts <= self._deferred:
      log.info("no progress for the stall limit, but host %s is compiling (%s) for up to %.0f s more: waiting "
               "for it", ", ".join(map(str, sorted(hosts))), "; ".join(n["phase"] for n in busy),
               max(n["until"] for n in busy) - time.time())
    self._deferred = hosts

  def _say(self, line: str) -> None:
    sys.stderr.write(NOTICE + line + "\n")
    _flush()

  def _exit(self, line: str) -> None:
    self._say(line)
    os._exit(1)


_WATCHDOG: Watchdog | None = None
_LISTENING = False


def _on_jax_event(event: str, duration_s: float, **_) -> None:
  if event.startswith(("/jax/core/compile/", "/jax/compilation_cache/")):
    progress.compile_ended()


def arm(cfg: state.RuntimeConfig, host_index: int) -> None:
  """Start the watchdog for this host; marks from the calling thread count as its progress."""
  global _WATCHDOG, _LISTENING
  disarm()
  progress.arm()
  if not _LISTENING:
    import jax
    jax.monitoring.register_event_duration_secs_listener(_on_jax_event)
    atexit.register(_at_exit)  # runs before JAX's own exit handler (its shutdown barrier)
    _LISTENING = True
  _WATCHDOG = Watchdog(cfg, host_index)
  _WATCHDOG.start()


def _at_exit() -> None:
  """No checks while the process leaves the job; and a host leaving after another was found stuck skips JAX's
  shutdown barrier: the stuck host exited without it, so the barrier would fail and JAX abort this process."""
  try:
    stuck = [n["host"] for n in control.failed_peers() if n["type"] == Stalled.__name__]
  except Exception:  # noqa: BLE001 - the service may be gone: JAX's own handler deals with it
    stuck = []
  disarm()
  if stuck:
    log.error("leaving the job without its shutdown barrier (host %d, stuck, never reaches it); exit 1", stuck[0])
    _flush()
    os._exit(1)


def _flush() -> None:
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except Exception:  # noqa: BLE001 - exiting anyway
      pass


def disarm() -> None:
  """Stop the watchdog (before leaving the job, or at exit); safe to call twice."""
  global _WATCHDOG
  progress.disarm()
  if _WATCHDOG is not None:
    _WATCHDOG.stop()
    _WATCHDOG = None
