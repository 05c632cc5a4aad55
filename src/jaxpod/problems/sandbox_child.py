"""The sandbox's child: run as `python -S -s -P sandbox_child.py CPU_S AS FSIZE NOFILE NPROC` in the scratch
directory with the program on stdin (`jaxpod.problems.sandbox` starts it; never imported by the parent).

It reads the program, sets the rlimits (soft = hard, so the program cannot raise them), restores SIGXFSZ's
default action (Python starts with it ignored, which turns the file-size limit into an OSError the parent cannot
tell from the program's own), installs the audit hook, seeds `random`, and runs the program as `__main__`; an
uncaught exception prints one line, `Type: message`, to stderr and exits 1 (a "File too large" the program
met with SIGXFSZ ignored ends it by SIGXFSZ after that line, so it is the file-size limit all the same). As PID 1 of a fresh PID namespace it first forks: the init stays
behind to reap and reports the program's death by signal n as exit status 128+n (the kernel spares an init
the default action of signals such as SIGXCPU).
"""
import errno
import os
import signal
import sys

READ_ONLY = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random")
WRITE_EVENTS = {"os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.rename": (0, 1), "os.link": (0, 1),
                "os.symlink": (1,), "os.truncate": (0,), "os.chmod": (0,), "os.chown": (0,), "os.utime": (0,),
                "os.chflags": (0,), "os.mkfifo": (0,), "os.mknod": (0,), "os.setxattr": (0,), "os.removexattr": (0,)}
LIST_EVENTS = {"os.listdir", "os.scandir"}  # a folder's names are a read of it (the machine's /proc without its own)
PROCESS_EVENTS = {"os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "subprocess.Popen",
                  "os.kill", "os.killpg", "signal.pthread_kill", "os.startfile"}
BLOCKED_MODULES = {"ctypes", "_ctypes", "_posixsubprocess", "multiprocessing", "_multiprocessing", "_xxsubinterpreters",
                   "_testcapi", "_testinternalcapi", "cffi", "_socket", "socket", "ssl", "_ssl"}


def _limit(cpu_s: int, address_space: int, fsize: int, nofile: int, nproc: int) -> None:
  import resource
  for name, value in (("RLIMIT_CPU", cpu_s), ("RLIMIT_AS", address_space), ("RLIMIT_FSIZE", fsize),
                      ("RLIMIT_NOFILE", nofile), ("RLIMIT_NPROC", nproc)):
    resource.setrlimit(getattr(resource, name), (value, value))


def _hook(scratch: str, readable: tuple[str, ...]):
  """The audit hook: refusals are PermissionErrors whose message the observation shows."""
  realpath, fsdecode, sep = os.path.realpath, os.fsdecode, os.sep

  def inside(path, roots) -> bool:
    p = realpath(fsdecode(path))
    return any(p == r or p.startswith(r + sep) for r in roots)

  def hook(event: str, args: tuple) -> None:
    if event == "open":
      path, mode, flags = args
      if isinstance(path, int):
        return
      write = bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC)) or (
          isinstance(mode, str) and any(c in mode for c in "wax+"))
      if write and not inside(path, (scratch,)):
        raise PermissionError("[write outside the scratch directory refused]")
      if not write and not inside(path, (scratch, *readable)) and fsdecode(path) not in READ_ONLY:
        raise PermissionError("[read outside the scratch directory refused]")
    elif event in LIST_EVENTS:
      path = args[0] if args[0] is not None else "."
      if not isinstance(path, int) and not inside(path, (scratch, *readable)):
        raise PermissionError("[read outside the scratch directory refused]")
    elif event in WRITE_EVENTS:
      for i in WRITE_EVENTS[event]:
        if not isinstance(args[i], int) and not inside(args[i], (scratch,)):
          raise PermissionError("[write outside the scratch directory refused]")
    elif event.startswith("socket."):
      raise PermissionError("[network disabled]")
    elif event in PROCESS_EVENTS:
      raise PermissionError("[processes disabled]")
    elif event == "import" and args[0] in BLOCKED_MODULES:
      raise PermissionError("[network disabled]" if "sock" in args[0] or "ssl" in args[0]
                            else f"[module {args[0]} disabled]")
    elif event.startswith("ctypes."):
      raise PermissionError("[ctypes disabled]")
  return hook


def _init() -> None:
  """PID 1 of the namespace: fork the program, reap everything, exit with its status (signal n: 128+n)."""
  child = os.fork()
  if child:
    while True:
      pid, status = os.wait()
      if pid == child:
        os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))


def main() -> None:
  """Read the program from stdin, contain it (see the module docstring), run it."""
  code = sys.stdin.read()
  if os.getpid() == 1:
    _init()
  _limit(*(int(a) for a in sys.argv[1:6]))
  signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
  import random
  random.seed(0)
  scratch = os.path.realpath(os.getcwd())
  readable = tuple(os.path.realpath(p) for p in sys.path if p and os.path.isdir(p))
  sys.stdin = open(os.devnull)
  sys.addaudithook(_hook(scratch, readable))
  program = {"__name__": "__main__", "__builtins__": __builtins__}
  try:
    exec(compile(code, "<program>", "exec"), program)
  except SystemExit:
    raise
  except BaseException as e:  # noqa: B036 - the program's error is the observation
    sys.stdout.flush()
    print(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__, file=sys.stderr)
    if isinstance(e, OSError) and e.errno == errno.EFBIG:
      sys.stderr.flush()
      signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
      signal.raise_signal(signal.SIGXFSZ)
    sys.exit(1)


if __name__ == "__main__":
  main()
