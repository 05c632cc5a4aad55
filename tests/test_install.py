"""Installs: every imported package is declared, and the base install needs no extra."""
from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

from jaxpod.runtime.extras import EXTRAS

REPO = Path(__file__).resolve().parents[1]
# import name -> distribution name, where they differ
DIST = {"yaml": "pyyaml", "orbax": "orbax-checkpoint", "tensorboardX": "tensorboardx", "grain": "grain"}
# Imported from a checkout the user names, never installed: the reference TRM's own package
# (`jaxpod bench trm-step --reference DIR` puts DIR on sys.path).
FROM_USER_CHECKOUT = {"models"}


def _dist(requirement: str) -> str:
  name = requirement
  for stop in "[<>=!~; ":
    name = name.split(stop)[0]
  return name.lower().replace("_", "-")


def _third_party_imports() -> set[str]:
  out = set()
  for p in (REPO / "src" / "jaxpod").rglob("*.py"):
    for node in ast.walk(ast.parse(p.read_text())):
      names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
          [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else []
      out |= {n.split(".")[0] for n in names}
  return {n for n in out if n not in sys.stdlib_module_names and n != "jaxpod" and n not in FROM_USER_CHECKOUT}


def test_every_imported_package_is_declared():
  project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
  base = {_dist(r) for r in project["dependencies"]}
  extras = {_dist(r) for reqs in project["optional-dependencies"].values() for r in reqs}
  for name in sorted(_third_party_imports()):
    dist = _dist(DIST.get(name, name))
    assert dist in base or dist in extras, f"src imports {name} but pyproject.toml does not declare {dist}"
    if dist not in base:
      assert name in EXTRAS, f"{name} is optional: list it in jaxpod.runtime.extras.EXTRAS (names its extra)"


BLOCKER = r"""
import sys
BLOCKED = set(sys.argv[1].split(","))
class Block:
  def find_spec(self, name, path=None, target=None):
    if name.split(".")[0] in BLOCKED:
      raise ModuleNotFoundError(f"No module named {name!r} (blocked: not in the base install)", name=name)
sys.meta_path.insert(0, Block())
import jaxpod.train.trainer, jaxpod.tasks.trm_sudoku, jaxpod.tasks.causal_lm, jaxpod.sample.run, jaxpod.extract.engine, jaxpod.runtime.doctor
from jaxpod.cli.main import main
assert main(["train", "--help"]) == 0
print("BASE_OK")
"""


def test_the_base_install_runs_without_any_extra():
  """What `make train` installs (`pip install -e .`) imports the workloads with every optional package absent."""
  blocked = sorted(set(EXTRAS))
  p = subprocess.run([sys.executable, "-c", BLOCKER, ",".join(blocked)], capture_output=True, text=True, timeout=300)
  assert p.returncode == 0 and "BASE_OK" in p.stdout, p.stderr[-3000:]
