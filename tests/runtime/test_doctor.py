"""`jaxpod doctor` through `jaxpod launch`, as a user runs it on a new pod."""
import subprocess
import sys

import pytest


@pytest.mark.multihost
def test_doctor_passes_on_four_simulated_hosts(tmp_path):
  p = subprocess.run([sys.executable, "-m", "jaxpod.cli.main", "launch", "--hosts", "4", "--log-dir", str(tmp_path),
                      "--", sys.executable, "-m", "jaxpod.cli.main", "doctor", "--runtime.program_check", "true"],
                     capture_output=True, text=True, timeout=300)
  assert p.returncode == 0, p.stdout + p.stderr
  for check in ("collective", "barrier", "broadcast", "compile cache", "program check"):
    assert check in p.stdout
  assert "sum over 4 devices = 10 (expected 10)" in p.stdout
  assert "FAIL" not in p.stdout


def test_doctor_rejects_a_bad_option_with_one_line():
  p = subprocess.run([sys.executable, "-m", "jaxpod.cli.main", "doctor", "--runtime.heartbeat_timeout_s", "0"],
                     capture_output=True, text=True, timeout=120)
  assert p.returncode == 2
  assert p.stderr.strip().splitlines()[-1] == "jaxpod doctor: error: runtime.heartbeat_timeout_s=0 must be >= 1 second"


def test_unknown_command_lists_the_commands():
  p = subprocess.run([sys.executable, "-m", "jaxpod.cli.main", "nope"], capture_output=True, text=True)
  assert p.returncode == 2 and "unknown command 'nope'" in p.stderr and "launch" in p.stderr


def test_a_failed_check_makes_doctor_exit_non_zero_with_the_reason(monkeypatch, capsys):
  """Single process, in this test process: a broken collective is reported, not raised."""
  from jaxpod.cli.main import main
  from jaxpod.runtime import doctor

  def broken():
    raise RuntimeError("cross-host sum gave 3.0, expected 10.0")

  monkeypatch.setattr(doctor, "_collective", broken)
  assert main(["doctor", "--barrier_rounds", "2"]) == 1
  err = capsys.readouterr().err
  assert "collective: RuntimeError: cross-host sum gave 3.0, expected 10.0" in err
