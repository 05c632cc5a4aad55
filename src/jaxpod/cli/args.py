"""Config parsing shared by every command: draccus (`--config_path FILE`, dotted overrides).

Dashes in option names are accepted (`--devices-per-host` == `--devices_per_host`), and a
tuple field takes a comma list (`--layers 4,8`). An old option name still works, on the command line
and in a `--config_path` file, with one warning naming the new one: a config class lists its renamed
fields in `old_names` (a ClassVar, old field -> new dotted path; `{"init_from": "hf"}`), and `parse`
translates them for every command, in nested sections and choice sections too (`renamed`). A bad
value, a missing or malformed `--config_path` file ends the command with one line naming the field or
file (exit 2), before anything expensive runs.
"""
from __future__ import annotations

import dataclasses
import os
import sys
import types
import typing
from typing import TypeVar

import draccus
from draccus.help_formatter import SimpleHelpFormatter

T = TypeVar("T")


class UsageError(SystemExit):
  """Bad command-line input: printed as one line, exit code 2."""


def fail(prog: str, message: object) -> UsageError:
  """Print `prog: error: message` (first line only) to stderr; return the exit-2 exception to raise."""
  text = str(message).strip().splitlines()
  print(f"{prog}: error: {text[0] if text else type(message).__name__}", file=sys.stderr)
  return UsageError(2)


class HelpFormatter(SimpleHelpFormatter):
  """draccus's formatter, keeping a literal `%` of a field comment literal (`H % KV == 0`).

  argparse %-formats every help string (for `%(default)s`); a field comment is prose, so its
  `%` signs are escaped here, once, for every command.
  """

  def _get_help_string(self, action):
    raw = action.help or ""
    full = super()._get_help_string(action) or ""
    return raw.replace("%", "%%") + full[len(raw):]


def normalise(argv: list[str]) -> list[str]:
  """Option names with dashes -> underscores (`--devices-per-host` -> `--devices_per_host`)."""
  out = []
  for a in argv:
    if a.startswith("--") and not a.startswith("--config"):
      name, eq, value = a[2:].partition("=")
      a = "--" + name.replace("-", "_") + eq + value
    elif a.startswith("--config-path"):
      a = a.replace("--config-path", "--config_path", 1)
    out.append(a)
  return out


def _field_types(cls: type) -> list[tuple[str, tuple]]:
  """(field name, its type's alternatives) of the dataclass `cls` (none when an annotation does not resolve)."""
  try:
    hints = typing.get_type_hints(cls)
  except Exception:  # noqa: BLE001 - an unresolvable annotation: nothing below it is known
    return []
  out = []
  for f in dataclasses.fields(cls):
    t = hints.get(f.name)
    out.append((f.name, typing.get_args(t) if typing.get_origin(t) in (typing.Union, types.UnionType) else (t,)))
  return out


def _sections(cls: type, prefix: str = "", depth: int = 0):
  """(dotted prefix, class) of `cls` and of every section under it: its fields' dataclasses and every registered
  choice of a choice section (each `task:` type), 4 levels down at most."""
  yield prefix, cls
  if depth >= 4:
    return
  for name, args in _field_types(cls):
    for a in args:
      if isinstance(a, type) and dataclasses.is_dataclass(a):
        choices = getattr(a, "get_known_choices", None)
        for sub in (choices().values() if choices else (a,)):
          yield from _sections(sub, f"{prefix}{name}.", depth + 1)


def _tuple_fields(cls: type) -> set[str]:
  """Dotted names of the fields of `cls` typed as a tuple or list (they take `--name 4,8`), nested sections and
  every registered choice of a choice section (`--task.lora.target_modules q_proj,v_proj`) included."""
  return {prefix + name for prefix, section in _sections(cls) for name, args in _field_types(section)
          if any(typing.get_origin(a) in (tuple, list) for a in args)}


def old_names(cls: type) -> dict[str, str]:
  """{old dotted name: new dotted name} of every renamed field under `cls`: each section's `old_names` (a ClassVar of
  old field -> new dotted path in that section), `task.init_from` -> `task.hf`."""
  return {prefix + old: prefix + new for prefix, section in _sections(cls)
          for old, new in getattr(section, "old_names", {}).items()}


_warned: set[str] = set()  # old names already warned about in this process


def _warn_once(prog: str, old: str, message: str) -> None:
  if old not in _warned:
    _warned.add(old)
    print(f"{prog}: warning: {message}", file=sys.stderr)


def _new_name(name: str, table: dict[str, str]) -> tuple[str, str] | None:
  """(old, new name of `name`) when `name` is an old name or sits under one (`task.type` under `task`), else None."""
  for old in sorted(table, key=len, reverse=True):
    if name == old or name.startswith(old + "."):
      return old, table[old] + name[len(old):]
  return None


def _renamed_file(path: str, table: dict[str, str], prog: str, tmp: str) -> str:
  """`path`, or a copy in `tmp` with its old keys written under their new names (each warned about once)."""
  import yaml
  with open(path) as f:
    data = yaml.safe_load(f)
  if not isinstance(data, dict):
    return path
  found = False
  for old in sorted(table, key=len, reverse=True):
    *parents, leaf = old.split(".")
    node = data
    for p in parents:
      node = node.get(p) if isinstance(node, dict) else None
    if not isinstance(node, dict) or leaf not in node:
      continue
    value, found = node.pop(leaf), True
    *new_parents, new_leaf = table[old].split(".")[len(parents):]  # the same section: the parents are shared
    for p in new_parents:
      if not isinstance(node.get(p), dict):
        node[p] = {}
      node = node[p]
    node[new_leaf] = value
    _warn_once(prog, old, f"{path}: `{old}` is now `{table[old]}` (the old name still works)")
  if not found:
    return path
  out = os.path.join(tmp, os.path.basename(path))
  with open(out, "w") as f:
    yaml.safe_dump(data, f)
  return out


def renamed(cls: type, argv: list[str], prog: str, tmp: str) -> list[str]:
  """(normalised) argv with the old option names of `cls` (`old_names`) replaced by the new ones, each warned about
  once on stderr; a `--config_path` file holding old keys is replaced by a translated copy in the folder `tmp`."""
  table = old_names(cls)
  if not table:
    return argv
  out = []
  for i, a in enumerate(argv):
    name, eq, value = a[2:].partition("=") if a.startswith("--") else ("", "", "")
    hit = _new_name(name, table) if name else None
    if hit is not None:
      old, new = hit
      _warn_once(prog, old, f"--{name} is now --{new} (the old name still works)")
      a = f"--{new}{eq}{value}"
    elif i and argv[i - 1] == "--config_path" and os.path.isfile(a):
      a = _renamed_file(a, table, prog, tmp)
    elif name == "config_path" and eq and os.path.isfile(value):
      a = f"--config_path={_renamed_file(value, table, prog, tmp)}"
    out.append(a)
  return out


def comma_lists(cls: type, argv: list[str]) -> list[str]:
  """`--layers 4,8` / `--layers=4,8` -> draccus's bracketed form for tuple fields of `cls`."""
  names, out, wrap_next = _tuple_fields(cls), [], False
  for a in argv:
    name, eq, value = a.partition("=")
    bare = name[2:].replace("-", "_") if name.startswith("--") else None
    if wrap_next and not a.startswith("--") and not a.startswith("["):
      a = f"[{a}]"
    elif bare in names and eq and not value.startswith("["):
      a = f"{name}=[{value}]"
    wrap_next = bare in names and not eq
    out.append(a)
  return out


def _bool_fields(cls: type) -> set[str]:
  """Dotted names of the fields of `cls` typed bool (nested sections included)."""
  return {prefix + name for prefix, section in _sections(cls) for name, args in _field_types(section) if bool in args}


def bare_flags(cls: type, argv: list[str]) -> list[str]:
  """`--compile` alone (at the end, or followed by another option) -> `--compile=true`, for bool fields of `cls`."""
  names = _bool_fields(cls)
  out = []
  for i, a in enumerate(argv):
    following = argv[i + 1] if i + 1 < len(argv) else "--"
    if a.startswith("--") and "=" not in a and a[2:].replace("-", "_") in names and following.startswith("--"):
      a = f"{a}=true"
    out.append(a)
  return out


def option_value(argv: list[str], option: str) -> str | None:
  """The value of `option` (`--name=value` or `--name value`) in (normalised) argv, if any."""
  for i, a in enumerate(argv):
    name, eq, value = a.partition("=")
    if name == option:
      return value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
  return None


def embedded_config(name: str) -> str:
  """Filesystem path of a default config shipped in the package (`jaxpod/configs/NAME`)."""
  from importlib import resources
  return str(resources.files("jaxpod.configs").joinpath(name))


def config_path_of(argv: list[str]) -> str | None:
  """The value of `--config_path` in (normalised) argv, if any."""
  return option_value(argv, "--config_path")


def check_config_file(path: str, prog: str) -> None:
  """A `--config_path` that is missing, not a file or not a YAML mapping: one line, exit 2."""
  import yaml
  if not path:
    raise fail(prog, "--config_path needs a file: --config_path configs/NAME.yaml")
  if not os.path.isfile(path):
    what = "is a folder" if os.path.isdir(path) else "does not exist"
    raise fail(prog, f"--config_path {path} {what}; point it at a YAML config file")
  try:
    with open(path) as f:
      data = yaml.safe_load(f)
  except (yaml.YAMLError, UnicodeDecodeError) as e:
    where = getattr(e, "problem_mark", None)
    at = f" at line {where.line + 1}" if where is not None else ""
    raise fail(prog, f"--config_path {path} is not valid YAML{at}: {getattr(e, 'problem', None) or e}") from None
  if data is not None and not isinstance(data, dict):
    raise fail(prog, f"--config_path {path} holds a {type(data).__name__}, not a mapping of config sections")


def parse(cls: type[T], argv: list[str], prog: str) -> T:
  """Parse argv into the frozen dataclass `cls`; one clear line and exit 2 on bad input."""
  import tempfile
  parser = draccus.argparsing.ArgumentParser(cls, prog=prog, formatter_class=HelpFormatter)
  if any(a in ("-h", "--help") for a in argv):
    parser.parse_args(["--help"])  # prints help and exits 0
  argv = normalise(argv)
  path = config_path_of(argv)
  if path is not None:
    check_config_file(path, prog)
  try:
    with tempfile.TemporaryDirectory() as tmp:
      return parser.parse_args(bare_flags(cls, comma_lists(cls, renamed(cls, argv, prog, tmp))))
  except SystemExit:
    raise
  except (ValueError, TypeError, KeyError, FileNotFoundError, draccus.utils.DecodingError,
          draccus.utils.ParsingError) as e:
    while isinstance(e, draccus.utils.ParsingError) and e.__cause__ is not None:
      e = e.__cause__  # the dataclass's own message names the field and the fix
    raise fail(prog, e) from None


def split_command(argv: list[str]) -> tuple[list[str], list[str]]:
  """(options, command) around the first '--'."""
  if "--" in argv:
    i = argv.index("--")
    return argv[:i], argv[i + 1:]
  return argv, []
