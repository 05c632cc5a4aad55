"""`jaxpod` entry point: find the command in `jaxpod.cli.commands`, parse, run, map errors to exit codes.

Handled here once for every command and benchmark:
  - `--help` (exit 0), unknown commands (exit 2, with the list);
  - bad input (a bad option value, a missing or malformed file: ValueError, FileNotFoundError, ...):
    one line `jaxpod CMD: error: ...` and exit 2 (set JAXPOD_TRACEBACK=1 to see the traceback);
  - another host's failure (`PeerFailed`), a missing peer job (`Unavailable`), or a failure whose message
    says all (an exception class with `one_line = True`, e.g. a raising RL reward plugin): one line, exit 1;
  - an optional package that is not installed: one line naming the pip extra, exit 2;
  - `--hosts N` (N > 1) outside `jaxpod launch`: rerun the same command as N simulated hosts.
"""
from __future__ import annotations

import importlib
import os
import sys
import traceback
from typing import Any

from jaxpod.cli.commands import COMMANDS, Command, Group

INPUT_ERRORS = (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError,
                UnicodeDecodeError)


def resolve(ref: str) -> Any:
  """The object named by "module:name"."""
  module, name = ref.split(":")
  return getattr(importlib.import_module(module), name)


def usage(path: list[str], table: dict[str, Command | Group]) -> str:
  """`usage: jaxpod ... COMMAND` and one help line per command."""
  width = max(len(n) for n in table)
  lines = [f"usage: {' '.join(path)} COMMAND [ARGS...]", "", "commands:"]
  return "\n".join(lines + [f"  {n.ljust(width)}  {c.help}" for n, c in table.items()])


def main(argv: list[str] | None = None) -> int:
  """Run `jaxpod ARGV`; returns the exit code."""
  argv = list(sys.argv[1:] if argv is None else argv)
  try:
    return dispatch(["jaxpod"], COMMANDS, argv)
  except SystemExit as e:  # --help (0) and one-line usage errors (2) end here
    return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)


def dispatch(path: list[str], table: dict[str, Command | Group], argv: list[str],
             default: Command | None = None) -> int:
  """Find argv[0] in `table` (or run `default`) and run it."""
  if argv and argv[0] in table:
    entry, rest = table[argv[0]], argv[1:]
    if isinstance(entry, Group):
      return dispatch([*path, argv[0]], entry.commands, rest, entry.default)
    return run_command([*path, argv[0]], entry, rest)
  if default is not None:
    return run_command(path, default, argv)
  if not argv or argv[0] in ("-h", "--help", "help"):
    print(usage(path, table))
    return 0
  print(f"{' '.join(path)}: unknown command {argv[0]!r}\n\n{usage(path, table)}", file=sys.stderr)
  return 2


def run_command(path: list[str], cmd: Command, argv: list[str]) -> int:
  """Parse the options, relaunch under `jaxpod launch` if asked, run, map errors to exit codes."""
  prog = " ".join(path)
  try:
    if cmd.config is None:
      return int(resolve(cmd.run)(argv, prog) or 0)
    cfg = load_options(cmd, argv, prog)
    if cmd.relaunch and getattr(cfg, "hosts", 1) > 1 and not inside_launch():
      return relaunch(path, argv, cfg)
    return int(resolve(cmd.run)(cfg) or 0)
  except SystemExit:
    raise
  except BaseException as e:
    return _failed(prog, e)


def load_options(cmd: Command, argv: list[str], prog: str) -> Any:
  """The command's options dataclass from argv (a leading bare argument fills `cmd.positional`)."""
  from jaxpod.cli.args import parse
  if cmd.positional and argv and not argv[0].startswith("-"):
    argv = [f"--{cmd.positional}", argv[0], *argv[1:]]
  if cmd.load:
    return resolve(cmd.load)(argv)
  return parse(resolve(cmd.config), argv, prog)


def inside_launch() -> bool:
  """True in a host started by `jaxpod launch`."""
  from jaxpod.runtime import hosts
  return hosts.ENV_PROCESS_ID in os.environ


def relaunch(path: list[str], argv: list[str], cfg: Any) -> int:
  """Run `jaxpod PATH ARGV` as cfg.hosts simulated hosts (host 0's output echoed); the job's exit code."""
  from jaxpod.runtime.launcher import LaunchConfig, launch
  cmd = [sys.executable, "-m", "jaxpod.cli.main", *path[1:], *argv]
  # Only benchmarks relaunch: they measure this machine and keep their scratch files in one local
  # folder, so the simulated hosts share its disk (pod-faithfulness is the tests' job, not theirs).
  lc = LaunchConfig(hosts=cfg.hosts, devices_per_host=getattr(cfg, "devices_per_host", 1), shared_local_disk=True)
  return launch(cmd, lc, echo_hosts={0}).returncode


def _is_input_error(e: BaseException) -> bool:
  yaml = sys.modules.get("yaml")
  return isinstance(e, INPUT_ERRORS) or (yaml is not None and isinstance(e, yaml.YAMLError))


def _first_line(e: BaseException) -> str:
  mark = getattr(e, "problem_mark", None)  # a YAML error: say which file and line
  if mark is not None:
    return f"{mark.name} is not valid YAML at line {mark.line + 1}: {getattr(e, 'problem', '')}"
  return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _failed(prog: str, e: BaseException) -> int:
  """Tell the other hosts (if any), print one line; exit 2 for bad input, 1 for a failure of the run (peer, plugin)."""
  from jaxpod.runtime.extras import explain
  control = sys.modules.get("jaxpod.runtime.control")  # loaded iff this process may have joined a job
  hint = explain(e)  # an optional package that is not installed: name the extra
  if hint is not None:
    if control is not None:
      control.abort(e)
    print(f"{prog}: error: {hint}", file=sys.stderr)
    return 2
  run_failed = getattr(e, "one_line", False) or (control is not None and isinstance(
      e, (control.PeerFailed, control.Unavailable)))
  if not run_failed and not _is_input_error(e):
    if control is not None:
      control.abort(e)
    raise e
  if control is not None and not getattr(e, "coordinated", False):  # coordinated: every host raises it itself
    control.abort(e)
  if os.environ.get("JAXPOD_TRACEBACK"):
    traceback.print_exception(e)
  first = _first_line(e)
  print(f"{prog}: {first}" if run_failed else f"{prog}: error: {first}", file=sys.stderr)
  return 1 if run_failed else 2


if __name__ == "__main__":
  sys.exit(main())
