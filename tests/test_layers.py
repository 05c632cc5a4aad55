"""The layers of docs/DESIGN.md, checked from the import graph of src/jaxpod (every import, lazy ones too).

    cli                                  top: the command table, parse, call one workload
    bench  plan                          benchmarks over the workloads; `jaxpod plan` (its --compile builds every
                                         task kind's real program, so it sits over tasks and rl, beside bench)
    tasks  rl                            what `jaxpod train` runs (TRM Sudoku, causal LM, preference) and RL
                                         post-training (train + sample + transfer): siblings, never importing each other
    policy                               what a trained Llama policy needs whoever trains it: its spec, LoRA rule,
                                         engine options, rollouts and episodes, held-out evaluator, warm-up, task base
    train  sample  extract  transfer     the workloads: never import each other
    problems                             what is solved: problem sets, environments, rewards, verifiers, pass@k
                                         (imports no JAX)
    models  data  io  configs
    runtime                              bottom

and no import cycle anywhere among the modules of src/jaxpod.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path


SRC = Path(__file__).resolve().parents[1] / "src"
RANK = {"cli": 8, "bench": 7, "tasks": 6, "rl": 6, "policy": 5, "train": 4, "sample": 4, "extract": 4, "transfer": 4,
        "problems": 3, "plan": 7, "models": 2, "data": 2, "io": 2, "configs": 2, "runtime": 1}
WORKLOADS = {"train", "sample", "extract", "transfer"}


def _module_name(path: Path) -> str:
  parts = list(path.relative_to(SRC).with_suffix("").parts)
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _exists(module: str) -> bool:
  base = SRC.joinpath(*module.split("."))
  return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _import_statements(path: Path):
  """(module, imported names) per import in the file, relative bases resolved: `import a.b` -> ("a.b", []),
  `from ..x import y` -> ("jaxpod.x", ["y"])."""
  me = _module_name(path)
  package = me if path.name == "__init__.py" else me.rpartition(".")[0]
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      yield from ((a.name, []) for a in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
        base = ".".join(anchor + ([base] if base else []))
      yield base, [a.name for a in node.names]


def _imports(path: Path) -> set[str]:
  """jaxpod modules imported anywhere in the file (`from jaxpod import runtime` -> jaxpod.runtime)."""
  out = set()
  for base, names in _import_statements(path):
    out.add(base)
    out |= {f"{base}.{n}" for n in names if _exists(f"{base}.{n}")}
  return {m for m in out if m == "jaxpod" or m.startswith("jaxpod.")}


GRAPH = {_module_name(p): _imports(p) for p in sorted(SRC.rglob("*.py"))}


def _room(module: str) -> str | None:
  """`jaxpod.train.trainer` -> "train"; None for the package root."""
  parts = module.split(".")
  return parts[1] if len(parts) > 1 else None


def test_every_room_has_a_rank():
  rooms = {_room(m) for m in GRAPH} - {None}
  assert rooms <= set(RANK) | {"__main__"}, rooms - set(RANK)


def test_no_module_imports_upward():
  bad = []
  for module, imported in GRAPH.items():
    src = _room(module)
    for target in imported:
      dst = _room(target)
      if src is None or dst is None or src == dst:
        continue
      if RANK[dst] > RANK[src]:
        bad.append(f"{module} ({src}) imports {target} ({dst})")
  assert not bad, ("imports must flow downward (cli > bench, plan > tasks, rl > policy > workloads > problems > "
                   "models/data/io > runtime):\n") + \
      "\n".join(bad)


def _cross_workload_imports() -> set[tuple[str, str]]:
  return {(m, t) for m, imported in GRAPH.items() for t in imported
          if _room(m) in WORKLOADS and _room(t) in WORKLOADS and _room(t) != _room(m)}


def test_workloads_do_not_import_each_other():
  """The LM task wires sampling into training from tasks/, a floor above both: train never imports sample."""
  bad = _cross_workload_imports()
  assert not bad, "\n".join(f"{m} imports {t}" for m, t in sorted(bad))


def test_tasks_and_rl_never_import_each_other():
  """tasks/ and rl/ are siblings on the policy floor: what the preference default shares with RL (the warm-up, the
  held-out evaluator, the engine set-up) lives in policy/, so neither imports the other, in either direction."""
  bad = {(m, t) for m, imported in GRAPH.items() for t in imported
         if {_room(m), _room(t)} == {"tasks", "rl"}}
  assert not bad, "\n".join(f"{m} imports {t}" for m, t in sorted(bad))


TASK_METHODS = {"abstract_model", "init_model", "initial_params", "loss_fn", "optimizer", "export_hooks"}


def test_the_llama_package_holds_no_task_base_or_optimizer_section():
  """models/llama/ is a model package: a trainer-task base (a class with the Task protocol's methods), a trainer hook
  or an optimizer section (a field `lr`) belongs to the policy floor (`jaxpod.policy.llama_task`)."""
  bad = []
  for path in sorted((SRC / "jaxpod" / "models" / "llama").rglob("*.py")):
    tree = ast.parse(path.read_text(), str(path))
    bad += [f"{path.name} imports {m}" for m in _imports(path) if m == "jaxpod.runtime.hooks"]
    for node in ast.walk(tree):
      if isinstance(node, ast.ClassDef):
        members = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
        fields = {n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
        bad += [f"{path.name}: {node.name}.{m}" for m in sorted(members & TASK_METHODS)]
        bad += [f"{path.name}: {node.name}.lr (an optimizer section)" for f in fields if f == "lr"]
  assert not bad, bad


def test_runtime_state_does_not_import_the_start_up_module():
  """No circle inside the runtime: start-up (distributed) -> control/program_check -> state, never back."""
  for low in ("jaxpod.runtime.state", "jaxpod.runtime.control", "jaxpod.runtime.program_check",
              "jaxpod.runtime.kv", "jaxpod.runtime.log", "jaxpod.runtime.hosts"):
    assert "jaxpod.runtime.distributed" not in GRAPH[low], low
  assert "jaxpod.runtime.distributed" not in GRAPH["jaxpod.runtime.state"]


def test_the_trainer_imports_no_model_family():
  bad = [f"{m} imports {t}" for m, imported in GRAPH.items() if _room(m) == "train" for t in imported
         if t.startswith("jaxpod.models.") and t != "jaxpod.models"]
  assert not bad, "\n".join(bad)


def test_every_workload_hook_is_the_runtime_hook():
  from jaxpod.runtime.hooks import Hook, StepInfo
  from jaxpod.sample.hook import SampleHook
  from jaxpod.train import hooks as train_hooks
  assert train_hooks.Hook is Hook and train_hooks.StepInfo is StepInfo
  assert issubclass(SampleHook, Hook) and issubclass(train_hooks.EvalHook, Hook)


def test_the_transfer_hook_is_the_runtime_hook():
  from jaxpod.runtime.hooks import Hook
  from jaxpod.transfer.hooks import PublishWeightsHook
  assert issubclass(PublishWeightsHook, Hook)


JAX_FAMILY = ("jax", "jaxlib", "flax", "optax", "orbax")


def test_problems_import_no_jax():
  """The problems layer is what is solved, not how: it names no JAX library in any import (lazy ones too), and
  importing every module of it in a fresh interpreter loads none."""
  modules = sorted(m for m in GRAPH if _room(m) == "problems")
  named = []
  for path in sorted((SRC / "jaxpod" / "problems").rglob("*.py")):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
      names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
          [node.module or ""] if isinstance(node, ast.ImportFrom) else []
      named += [f"{path.name}: {n}" for n in names if n.split(".")[0] in JAX_FAMILY]
  assert not named, named
  code = (f"import sys; import {', '.join(modules)}; "
          f"print(sorted(m for m in sys.modules if m.split('.')[0] in {JAX_FAMILY}))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={"PYTHONPATH": str(SRC)},
                       check=True)
  assert out.stdout.strip() == "[]", f"importing {modules} loaded {out.stdout.strip()}"


def _edges(path: Path) -> set[str]:
  """The jaxpod modules whose code runs when this file's imports run: `from pkg import mod` names the module
  `pkg.mod`, `from pkg import name` the package `pkg`; a module's own ancestors (their face runs first) left out."""
  me = _module_name(path)
  out = set()
  for base, names in _import_statements(path):
    out |= {f"{base}.{n}" if _exists(f"{base}.{n}") else base for n in names} if names else {base}
  ancestors = {".".join(me.split(".")[:i]) for i in range(1, len(me.split(".")))}
  return {m for m in out if m.startswith("jaxpod.") and _exists(m) and m != me and m not in ancestors}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """Every strongly connected group of two or more modules (each can reach the others by imports), sorted."""
  order: dict[str, int] = {}  # discovery order
  low: dict[str, int] = {}  # the earliest module on the stack reachable from here
  stack: list[str] = []
  cycles = []
  for root in sorted(graph):
    if root in order:
      continue
    work = [(root, iter(sorted(graph[root])))]
    order[root] = low[root] = len(order)
    stack.append(root)
    while work:
      node, targets = work[-1]
      target = next(targets, None)
      if target is not None:
        if target not in order:
          order[target] = low[target] = len(order)
          stack.append(target)
          work.append((target, iter(sorted(graph.get(target, ())))))
        elif target in stack:
          low[node] = min(low[node], order[target])
        continue
      work.pop()
      if work:
        low[work[-1][0]] = min(low[work[-1][0]], low[node])
      if low[node] == order[node]:
        group = []
        while True:
          member = stack.pop()
          group.append(member)
          if member == node:
            break
        if len(group) > 1:
          cycles.append(sorted(group))
  return sorted(cycles)


def test_import_cycles_are_found():
  assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
  assert import_cycles({"a": {"b"}, "b": set(), "c": {"d"}, "d": {"c", "a"}}) == [["c", "d"]]


def test_no_import_cycle_among_the_modules():
  """A cycle, module-level or through a function's import, makes two modules one: neither can be read, tested or
  moved without the other."""
  graph = {_module_name(p): _edges(p) for p in sorted(SRC.rglob("*.py"))}
  cycles = import_cycles(graph)
  assert not cycles, "import cycles:\n" + "\n".join(
      " <-> ".join(c) + ": " + "; ".join(f"{m} -> {t}" for m in c for t in sorted(graph[m] & set(c))) for c in cycles)
