"""Every complete `jaxpod ...` command written in the README and docs/ parses with today's options.

A renamed option (issue 49: `--task.hf`, `--problems.type`, ...) must not leave a doc telling users a command that
is refused. A command counts as complete when it names at least one option and no placeholder (an upper-case word
such as DIR, `...`, `[--optional]`, `a|b`); prose mentions (`jaxpod sample`) are not commands. Parsing only: a
config's own checks of what exists on disk (`task.hf=... : no config.json there`) are the run's business.
"""
from __future__ import annotations

import contextlib
import io
import pathlib
import re
import shlex

from jaxpod.cli.commands import COMMANDS, Group
from jaxpod.cli.main import load_options

ROOT = pathlib.Path(__file__).resolve().parents[2]
SPAN = re.compile(r"`(jaxpod [^`]+)`")
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$|\.\.\.|[\[\]<>|]")
ON_DISK = ("no config.json", "not found", "does not exist", "no such file")


def written_commands():
  """(file:line, command) of every `jaxpod ...` span and code-block line."""
  for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
    in_block, pending = False, ""
    for n, line in enumerate(path.read_text().splitlines(), 1):
      if line.strip().startswith("```"):
        in_block, pending = not in_block, ""
      elif in_block and (pending or line.strip().startswith("jaxpod ")):
        text = pending + " " + re.split(r"\s+#", line.strip())[0]
        pending = text[:-1] if text.endswith("\\") else ""  # a command continued on the next line
        if not pending:
          yield f"{path.name}:{n}", text.strip()
      elif not in_block:
        yield from ((f"{path.name}:{n}", m.group(1)) for m in SPAN.finditer(line))


def complete(argv: list[str]) -> bool:
  """Options given with values and no placeholder; a span ending in a bare option names that option in prose."""
  return (any(a.startswith("--") for a in argv) and not argv[-1].startswith("--")
          and not any(PLACEHOLDER.search(a) for a in argv))


def command_of(argv: list[str]):
  """(Command or None, its options, prog) of `jaxpod ARGV`; a `launch ... --` prefix is skipped."""
  if argv[:1] == ["launch"] and "--" in argv:
    argv = argv[argv.index("--") + 1:]
    argv = argv[1:] if argv[:1] == ["jaxpod"] else []
  table, path, default = COMMANDS, ["jaxpod"], None
  while argv and argv[0] in table:
    path.append(argv[0])
    entry, argv = table[argv[0]], argv[1:]
    if isinstance(entry, Group):
      table, default = entry.commands, entry.default
      continue
    return entry, argv, " ".join(path)
  return default, argv, " ".join(path)


def test_every_complete_command_in_the_docs_parses_under_todays_names(monkeypatch):
  """...and none uses an old name (accepted with a warning for users' scripts; the docs teach the new one)."""
  from jaxpod.cli import args
  checked, refused = 0, []
  for where, text in written_commands():
    try:
      argv = shlex.split(text)[1:]
    except ValueError:
      continue
    if not complete(argv):  # prose, or a template with placeholders
      continue
    cmd, options, prog = command_of(argv)
    if cmd is None or cmd.config is None or "--help" in options:
      continue
    checked += 1
    err = io.StringIO()
    monkeypatch.setattr(args, "_warned", set())  # each command's old names warn afresh
    try:
      with contextlib.redirect_stderr(err):
        load_options(cmd, options, prog)
      warned = [line for line in err.getvalue().splitlines() if ": warning: " in line]
      refused.extend(f"{where}: {text}\n    {line}" for line in warned)
    except SystemExit:
      line = (err.getvalue().strip().splitlines() or ["?"])[-1]
      if not any(s in line for s in ON_DISK):
        refused.append(f"{where}: {text}\n    {line}")
    except Exception as e:  # noqa: BLE001 - any refusal is reported with its place
      if not any(s in str(e) for s in ON_DISK):
        refused.append(f"{where}: {text}\n    {type(e).__name__}: {e}")
  assert checked >= 20, f"only {checked} complete commands found: the scan no longer reads the docs"
  assert not refused, "commands in the docs that no longer parse:\n" + "\n".join(refused)
