"""JAXPOD_PROGRAM_CHECK switches the cross-host program check on without editing code."""
import pytest

from jaxpod.runtime import program_check


@pytest.mark.parametrize("value, on", [("1", True), ("true", True), ("ON", True), ("0", False), ("", False),
                                       ("off", False)])
def test_env_values(monkeypatch, value, on):
  monkeypatch.setenv(program_check.ENV_VAR, value)
  assert program_check.env_enabled() is on


def test_a_typo_is_an_error_naming_the_variable(monkeypatch):
  monkeypatch.setenv(program_check.ENV_VAR, "yes please")
  with pytest.raises(ValueError, match=r"JAXPOD_PROGRAM_CHECK='yes please': use 1"):
    program_check.env_enabled()
