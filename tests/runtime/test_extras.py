"""A missing optional package names the pip extra that installs it."""
import pytest

from jaxpod.runtime import extras


def test_require_imports_an_installed_optional_package():
  assert extras.require("numpy").__name__ == "numpy"


def test_require_names_the_extra(monkeypatch):
  monkeypatch.setitem(extras.EXTRAS, "jaxpod_no_such_pkg", ("transfer", "no-such-pkg"))
  with pytest.raises(extras.MissingExtra, match=r"'no-such-pkg' is not installed for the demo; install the "
                                                r"'transfer' extra: pip install -e '.\[transfer\]'"):
    extras.require("jaxpod_no_such_pkg", "the demo")


def test_explain_knows_submodules_and_ignores_unknown_packages():
  assert "'.[transfer]'" in extras.explain(ModuleNotFoundError("No module named 'ray.util'", name="ray.util"))
  assert "'.[bench]'" in extras.explain(ModuleNotFoundError("No module named 'torch'", name="torch"))
  assert extras.explain(ModuleNotFoundError("No module named 'nope'", name="nope")) is None
  assert extras.explain(ValueError("x")) is None
