"""bench/ in wings: its top level holds only packages and common.py, each command lives where its name says, and
every benchmark module, file or command that the code and the docs name exists (read as text: nothing imported)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from jaxpod.cli.commands import BENCHES

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "jaxpod"
BENCH = PACKAGE / "bench"
TEXTS = sorted([*PACKAGE.rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "docs").rglob("*.md"),
                ROOT / "README.md", *(ROOT / "configs").glob("*.yaml")])


def _names(pattern: str) -> set[tuple[str, str]]:
  """(file, match) of every match of the regex in the code, tests, docs and configs."""
  return {(str(p.relative_to(ROOT)), m.group(1)) for p in TEXTS for m in re.finditer(pattern, p.read_text())}


def _module_file(dotted: str) -> tuple[Path | None, list[str]]:
  """The file of the longest module prefix of `jaxpod.a.b.name`, and the names after it."""
  parts = dotted.split(".")
  for n in range(len(parts), 1, -1):
    base = PACKAGE.parent.joinpath(*parts[:n])
    for f in (base.with_suffix(".py"), base / "__init__.py"):
      if f.is_file():
        return f, parts[n:]
  return None, parts


def _defines(path: Path, name: str) -> bool:
  """The module's top level defines `name` (a def, class, assignment or import) or holds a module of that name."""
  tree = ast.parse(path.read_text())
  for node in tree.body:
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
      return True
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
      targets = node.targets if isinstance(node, ast.Assign) else [node.target]
      if any(isinstance(t, ast.Name) and t.id == name for t in targets):
        return True
    if isinstance(node, (ast.Import, ast.ImportFrom)) and any((a.asname or a.name) == name for a in node.names):
      return True
  return path.name == "__init__.py" and ((path.parent / f"{name}.py").is_file() or (path.parent / name).is_dir())


def _missing(dotted: str) -> str | None:
  """Why a dotted module path (with an optional `:Name`) names nothing; None when the module (and the name) exist."""
  module, _, attr = dotted.partition(":")
  path, rest = _module_file(module)
  if path is None:
    return "no such module"
  names = rest + ([attr] if attr else [])
  if names and not _defines(path, names[0]):
    return f"{path.relative_to(ROOT)} defines no {names[0]}"
  return None


def test_bench_top_level_holds_only_wings_and_common():
  entries = {p.name for p in BENCH.iterdir() if p.name != "__pycache__"}
  loose = {e for e in entries - {"__init__.py", "common.py"} if not (BENCH / e / "__init__.py").is_file()}
  assert not loose, f"bench/ holds only packages (wings) and common.py; move {sorted(loose)} into a wing"


def test_each_bench_command_lives_in_the_module_its_name_gives():
  """`jaxpod bench W` runs bench/W/command.py, `jaxpod bench W-X` runs bench/W/X.py; its options class is there too."""
  for name, command in BENCHES.items():
    wing, _, rest = name.partition("-")
    expected = f"jaxpod.bench.{wing}.{(rest or 'command').replace('-', '_')}"
    for target in (command.run, command.config):
      assert target.partition(":")[0] == expected, f"jaxpod bench {name}: {target} is not in {expected}"
      assert _missing(target) is None, f"jaxpod bench {name}: {target}: {_missing(target)}"


def test_every_bench_module_named_in_code_or_docs_exists():
  """`python -m jaxpod.bench...` children, `module:Name` strings and the docs' module and attribute names."""
  named = _names(r"(jaxpod\.bench(?:\.\w+)+(?::\w+)?)") | {(f, "jaxpod." + m) for f, m in _names(r"`(bench\.[\w.]+)`")}
  assert len(named) > 20  # the child processes, the command table and the docs' names are all read
  bad = [f"{f}: {m}: {_missing(m)}" for f, m in sorted(named) if _missing(m)]
  assert not bad, "\n".join(bad)


def test_every_bench_file_named_in_code_or_docs_exists():
  named = _names(r"(?<![\w/])(?:src/jaxpod/)?(bench/[a-z0-9_/]+\.py)")
  assert named
  bad = [f"{f}: {m}" for f, m in sorted(named) if not (PACKAGE / m).is_file()]
  assert not bad, "no such file:\n" + "\n".join(bad)


def test_every_bench_command_named_in_code_or_docs_is_registered():
  named = _names(r"jaxpod bench ([a-z][\w-]*)")
  assert named
  bad = [f"{f}: jaxpod bench {m}" for f, m in sorted(named) if m not in BENCHES]
  assert not bad, f"not a benchmark (they are: {', '.join(BENCHES)}):\n" + "\n".join(bad)
