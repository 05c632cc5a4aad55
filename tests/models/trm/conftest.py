"""Fixtures for parity with the reference PyTorch TRM (an unmodified export, outside the repository).

The reference folder is `$JAXPOD_TRM_REFERENCE`, else `<repo>/../shared/reference/trm_pytorch` (the
team's shared folder beside the checkout, as CI has it). Its files are loaded in place, never copied.
"""
from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import pytest

_REPO = Path(__file__).resolve().parents[3]
_CANDIDATES = (_REPO.parent / "shared" / "reference" / "trm_pytorch",)


def find_reference() -> Path | None:
  """The reference folder (it holds models/recursive_reasoning/trm.py), or None."""
  env = os.environ.get("JAXPOD_TRM_REFERENCE")
  for p in ([Path(env)] if env else list(_CANDIDATES)):
    if (p / "models" / "recursive_reasoning" / "trm.py").is_file():
      return p
  return None


@pytest.fixture(scope="session")
def trm_reference() -> Path:
  """The reference folder; skips (naming the variable to set) only where it is absent."""
  pytest.importorskip("torch", reason="the reference TRM is PyTorch; install the dev extra")
  ref = find_reference()
  if ref is None:
    pytest.skip("reference TRM not found: set JAXPOD_TRM_REFERENCE to a TinyRecursiveModels checkout")
  return ref


@contextlib.contextmanager
def reference_on_path(ref: Path):
  """Import the reference's top-level `models` package, then forget it (no clash with other `models`)."""
  saved = {k: v for k, v in sys.modules.items() if k == "models" or k.startswith("models.")}
  for k in saved:
    del sys.modules[k]
  sys.path.insert(0, str(ref))
  try:
    yield
  finally:
    sys.path.remove(str(ref))
    for k in [k for k in sys.modules if k == "models" or k.startswith("models.")]:
      del sys.modules[k]
    sys.modules.update(saved)
