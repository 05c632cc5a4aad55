"""`jaxpod launch`: per-host env, prefixed output, logs, fail-fast, summary, bad input."""
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jaxpod.runtime.launcher import LaunchConfig, launch

PY = sys.executable


def _run(code: str, hosts=2, **kw):
  import io
  buf = io.StringIO()
  r = launch([PY, "-c", code], LaunchConfig(hosts=hosts, **kw), sink=buf, summary=buf)
  return r, buf.getvalue()


def test_each_host_gets_its_variables_and_a_prefixed_log(tmp_path):
  code = "import os; print(os.environ['JAXPOD_PROCESS_ID'], os.environ['JAXPOD_NUM_PROCESSES'], " \
         "os.environ['JAXPOD_DEVICES_PER_HOST'], os.environ['JAXPOD_COORDINATOR'].startswith('127.0.0.1:'))"
  r, out = _run(code, hosts=3, devices_per_host=2, log_dir=str(tmp_path))
  assert r.returncode == 0 and r.first_failed is None
  for i in range(3):
    assert f"[host {i}/3] {i} 3 2 True" in out
    assert (tmp_path / f"host_{i}.log").read_text().strip() == f"{i} 3 2 True"
  assert "all 3 hosts exited 0" in out


def test_first_failure_stops_the_others_even_if_they_ignore_sigterm(tmp_path):
  """JAX swallows SIGTERM; the launcher must follow up with SIGKILL after the grace period."""
  ready = tmp_path / "ready"
  ready.mkdir()
  code = ("import os, signal, sys, time, pathlib\n"
          "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
          f"ready = pathlib.Path({str(ready)!r})\n"
          "me = os.environ['JAXPOD_PROCESS_ID']\n"
          "(ready / me).touch()\n"
          "if me == '1':\n"
          "  while len(list(ready.iterdir())) < 3: time.sleep(0.05)\n"
          "  print('loading shard 3'); print('bad checksum', flush=True); sys.exit(3)\n"
          "time.sleep(600)\n")
  r, out = _run(code, hosts=3, grace_s=0.5, log_dir=str(tmp_path / "logs"))
  assert r.returncode == 3 and r.first_failed == 1 and r.reason == "exit"
  assert r.exit_codes[0] == -signal.SIGKILL and r.exit_codes[2] == -signal.SIGKILL
  assert "host 1/3 failed first (exit code 3)" in out and "    bad checksum" in out


def test_timeout_stops_everything():
  r, out = _run("import time; time.sleep(600)", hosts=2, timeout_s=1, grace_s=0.2)
  assert r.reason == "timeout" and r.returncode == 124 and "timed out" in out


@pytest.mark.parametrize("kwargs, field", [({"hosts": 0}, "--hosts"), ({"devices_per_host": 0}, "--devices-per-host"),
                                           ({"port": 70000}, "--port"), ({"log_dir": "gs://b/l"}, "--log-dir gs://b/l: "),
                                           ({"hosts_root": "s3://b/h"}, "--hosts-root")])
def test_bad_config_names_the_option(kwargs, field):
  with pytest.raises(ValueError, match=field):
    LaunchConfig(**kwargs)


def test_port_in_use_is_reported_before_starting_hosts():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    s.listen()
    port = s.getsockname()[1]
    with pytest.raises(ValueError, match=f"--port {port} is in use"):
      launch([PY, "-c", "pass"], LaunchConfig(hosts=2, port=port), sink=None, summary=None)


def test_unknown_command_is_one_clear_error():
  with pytest.raises(ValueError, match="command not found: 'no-such-binary-xyz'"):
    launch(["no-such-binary-xyz"], LaunchConfig(hosts=2), sink=None, summary=None)


def test_cli_rejects_zero_hosts_with_one_line():
  p = subprocess.run([PY, "-m", "jaxpod.cli.main", "launch", "--hosts", "0", "--", "true"], capture_output=True,
                     text=True)
  assert p.returncode == 2
  assert p.stderr.strip().splitlines()[-1].startswith("jaxpod launch: error: --hosts must be >= 1, got 0")


def test_ctrl_c_stops_every_host(tmp_path):
  marker = tmp_path / "pids"
  code = f"import os, time; open({str(marker)!r} + os.environ['JAXPOD_PROCESS_ID'], 'w').write(str(os.getpid())); time.sleep(600)"
  p = subprocess.Popen([PY, "-m", "jaxpod.cli.main", "launch", "--hosts", "2", "--grace-s", "1", "--", PY, "-c", code],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  deadline = time.time() + 60
  while not all(Path(f"{marker}{i}").exists() for i in range(2)) and time.time() < deadline:
    time.sleep(0.1)
  p.send_signal(signal.SIGINT)
  assert p.wait(timeout=30) == 130
  for i in range(2):
    pid = int(Path(f"{marker}{i}").read_text())
    with pytest.raises(ProcessLookupError):
      os.kill(pid, 0)


_WHERE = ("import os, pathlib, tempfile\n"
          "i = os.environ['JAXPOD_PROCESS_ID']\n"
          "pathlib.Path('mine.txt').write_text(i)\n"
          "import time; time.sleep(0.5)\n"
          "print('WHERE', os.getcwd(), os.environ['HOME'], tempfile.gettempdir(), pathlib.Path('mine.txt').read_text(),"
          " os.environ.get('JAXPOD_SHARED_LOCAL_DISK', '-'))\n")


def _where(out: str, host: int) -> list[str]:
  return next(l for l in out.splitlines() if l.startswith(f"[host {host}/2] WHERE")).split()[3:]


def test_hosts_are_isolated_by_default_like_vms_of_a_pod(tmp_path):
  """Invariant 8: each host has its own working directory, HOME and TMPDIR under its private root; a file one
  host writes to its working directory is not the other's."""
  r, out = _run(_WHERE, log_dir=str(tmp_path / "logs"), hosts_root=str(tmp_path / "roots"))
  assert r.returncode == 0, out
  (cwd0, home0, tmp0, mine0, shared0), (cwd1, home1, tmp1, mine1, _) = _where(out, 0), _where(out, 1)
  assert len({cwd0, cwd1}) == len({home0, home1}) == len({tmp0, tmp1}) == 2
  assert cwd0 == str(tmp_path / "roots" / "host_0" / "work") and home1 == str(tmp_path / "roots" / "host_1" / "home")
  assert (mine0, mine1, shared0) == ("0", "1", "-")


def test_shared_local_disk_is_an_explicit_choice(tmp_path, monkeypatch):
  """`--shared-local-disk true`: one working directory and HOME, and JAXPOD_SHARED_LOCAL_DISK=1 tells jaxpod."""
  monkeypatch.chdir(tmp_path)  # the hosts write mine.txt into the shared working directory
  r, out = _run(_WHERE, log_dir=str(tmp_path / "logs"), shared_local_disk=True)
  assert r.returncode == 0, out
  w0, w1 = _where(out, 0), _where(out, 1)
  assert w0[:3] == w1[:3] and w0[4] == w1[4] == "1"


def test_a_relative_script_path_runs_on_every_isolated_host(tmp_path, monkeypatch):
  """The code is installed on every host alike: `jaxpod launch -- python script.py` finds script.py although
  each host starts in its own empty working directory."""
  (tmp_path / "script.py").write_text("print('RAN')\n")
  monkeypatch.chdir(tmp_path)
  import io
  buf = io.StringIO()
  r = launch([PY, "script.py"], LaunchConfig(hosts=2, log_dir=str(tmp_path / "logs")), sink=buf, summary=buf)
  assert r.returncode == 0 and buf.getvalue().count("RAN") == 2, buf.getvalue()
