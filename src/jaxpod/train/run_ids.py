"""Run ids that survive upgrades: a run folder is named by the fields of its config that differ from their defaults.

    name = run_name(cfg, "trm", RUN_ID_IGNORES, root="train", kind="trm_sudoku")   # 'trm-1f639e613e92'
    url = find_run(runs_url, name, legacy_run_id(cfg, "trm", RUN_ID_IGNORES, "train", "trm_sudoku"))

The same command gives the same folder, so a rerun resumes (invariant 8). The id used to hash every field of the
config, so every field added to jaxpod (`grpo.trim_rows`, `WarmupConfig.grad_clip`) changed every run id and the
same command rerun after an upgrade started its run over. Now it hashes only what differs from the defaults: a field
added with a default, and a default that changes, leave ids as they were (a nested section is compared with its
field's default value, a registry choice with its own class's defaults; the choice's name is always hashed; a
section that is None by default and given counts as given).

A run folder named by the old rule (jaxpod up to commit 02776ac) is found again: `legacy_run_id` rebuilds the tree
the old code hashed for the same command from that code's default trees (`legacy_run_trees.json`, one per task
or problem set) with this config's changes on top, and hashes it as the old code did; an option renamed since (a
section's `old_names`, which the CLI still accepts) goes under its old name. A command that sets a field the old
code did not have has no old run.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from importlib import resources

from jaxpod.runtime import storage
from jaxpod.runtime.log import get_logger

log = get_logger("train.run_ids")
GIVEN = "__given__"  # marks a section that is None by default and given (with or without changes of its own)
_MISSING = object()


def _json(value):
  """A value as the config's JSON holds it (dataclasses as dicts, tuples as lists, other objects as text)."""
  if dataclasses.is_dataclass(value) and not isinstance(value, type):
    value = dataclasses.asdict(value)
  return json.loads(json.dumps(value, default=str))


def _default(field: dataclasses.Field, base):
  """A field's default: its value in `base` (the section's default value), else the class's default."""
  if base is not None:
    return getattr(base, field.name)
  if field.default is not dataclasses.MISSING:
    return field.default
  if field.default_factory is not dataclasses.MISSING:
    return field.default_factory()
  return _MISSING


def _section_base(value, default):
  """What a nested section is compared with: its field's default value if of the same class, else its own class's
  defaults (None)."""
  return default if type(default) is type(value) else None


def changed(cfg, ignores: tuple[str, ...] = (), base=None, at: str = "") -> dict:
  """The fields of dataclass `cfg` whose values differ from their defaults, nested sections as dicts of theirs;
  dotted paths in `ignores` left out."""
  out = {}
  for f in dataclasses.fields(cfg):
    path = at + f.name
    if path in ignores:
      continue
    value, default = getattr(cfg, f.name), _default(f, base)
    if dataclasses.is_dataclass(value):
      sub = changed(value, ignores, _section_base(value, default), path + ".")
      if default is None:
        sub = {GIVEN: True, **sub}
      if sub:
        out[f.name] = sub
    elif default is _MISSING or _json(value) != _json(default):
      out[f.name] = _json(value)
  return out


def _digest(tree: dict) -> str:
  return hashlib.sha256(json.dumps(tree, sort_keys=True).encode()).hexdigest()[:12]


def run_name(cfg, prefix: str, ignores: tuple[str, ...], kind: str, choice: str = "task") -> str:
  """`<prefix>-<12 hex>`: a hash of the fields that differ from their defaults (without `ignores`) and of the
  registry name `kind` of section `choice` (two tasks with equal fields are different runs)."""
  tree = changed(cfg, ignores)
  tree[choice] = {**tree.get(choice, {}), "type": kind}
  return f"{prefix}-{_digest(tree)}"


@functools.cache
def _legacy_trees() -> dict:
  return json.loads(resources.files("jaxpod.train").joinpath("legacy_run_trees.json").read_text())


def _unchanged(value, default) -> bool:
  if dataclasses.is_dataclass(value):
    return default is not None and default is not _MISSING and not changed(value, (), _section_base(value, default))
  return default is not _MISSING and _json(value) == _json(default)


def _at(obj, dotted: str):
  for name in dotted.split("."):
    obj = getattr(obj, name, None) if obj is not None else None
  return obj


def _old_tree(cfg, old: dict, ignores: tuple[str, ...], base=None, at: str = "", moved: frozenset = frozenset()
              ) -> dict | None:
  """The tree the old rule hashed for `cfg`'s command: `old` (its defaults then) with `cfg`'s changes; None when
  `cfg` sets a field the old code did not have. A field renamed since (a section's `old_names`, the ones the CLI
  still accepts: `task.init_from` -> `task.hf`, rl's `task` -> `problems`, `lora_lr_scale` -> `lora.lr_scale`)
  goes under its old name; `moved`: the dotted paths a parent section already put under their old names."""
  out = dict(old)
  renames = {old_name: new for old_name, new in getattr(type(cfg), "old_names", {}).items() if old_name in old}
  was = {new: old_name for old_name, new in renames.items() if "." not in new}
  moved = moved | {at + new for new in renames.values() if "." in new}
  for f in dataclasses.fields(cfg):
    path = at + f.name
    if path in ignores or path in moved:
      continue
    key = was.get(f.name, f.name)
    value, default = getattr(cfg, f.name), _default(f, base)
    if key not in old:  # added since: only its default can have been the old command's
      if not _unchanged(value, default):
        return None
    elif dataclasses.is_dataclass(value) and isinstance(old[key], dict):
      sub = _old_tree(value, old[key], ignores, _section_base(value, default), path + ".", moved)
      if sub is None:
        return None
      out[key] = sub
    elif not _unchanged(value, default):
      out[key] = _json(value)
      if isinstance(out[key], dict):  # a section None by default, given: without what moved into it since
        for new in (m[len(path) + 1:] for m in moved if m.startswith(path + ".")):
          out[key].pop(new, None)
  for old_name, new in renames.items():  # a field moved into a sub-section since: its value, if given
    if "." in new:
      value = _at(cfg, new)
      if value is not None and not _unchanged(value, _at(base, new) if base is not None else _new_default(cfg, new)):
        out[old_name] = _json(value)
  return out


def _new_default(cfg, dotted: str):
  """The class default of the field at `dotted` under section `cfg` (through sections None by default: their
  class's defaults)."""
  *parents, name = dotted.split(".")
  obj = cfg
  for p in parents:
    obj = getattr(obj, p)
  f = next(f for f in dataclasses.fields(obj) if f.name == name)
  return _default(f, None)


def legacy_run_id(cfg, prefix: str, ignores: tuple[str, ...], root: str, kind: str) -> str | None:
  """The name the old rule gave this command's run folder (`root`: "train" or "rl"; `kind`: the task or problem
  set), or None if the old code could not have run it."""
  old = _legacy_trees()[root].get(kind)
  if old is None:
    return None
  tree = _old_tree(cfg, old, ignores)
  return None if tree is None else f"{prefix}-{_digest(tree)}"


def find_run(runs_url: str, name: str, legacy_name: str | None) -> str:
  """The run folder's URL: `<runs_url>/<name>`, unless only the folder the old rule named exists (a run started
  before the rule changed): that one is resumed."""
  url = storage.join(runs_url, name)
  if legacy_name and legacy_name != name and not storage.exists(url):
    old = storage.join(runs_url, legacy_name)
    if storage.exists(old):
      log.info("resuming %s: named by the run-id rule before jaxpod hashed only the fields that differ from their "
               "defaults (this command's new name is %s)", old, name)
      return old
  return url
