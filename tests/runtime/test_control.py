"""Control plane across real processes (invariants 2 and 3 of DESIGN.md)."""
import json
from pathlib import Path

import pytest

from tests.conftest import host_lines

WORKER = Path(__file__).parent / "workers" / "control_worker.py"
pytestmark = pytest.mark.multihost


@pytest.fixture(scope="module")
def roundtrip(tmp_path_factory):
  """roundtrip(hosts) -> the module's one launch of the `roundtrip` worker on that many hosts (several tests read it)."""
  from tests.conftest import launch_hosts_once
  made = {}

  def get(hosts: int):
    if hosts not in made:
      made[hosts] = launch_hosts_once(WORKER, tmp_path_factory.mktemp(f"roundtrip_{hosts}"), hosts=hosts,
                                      devices_per_host=1, args=["roundtrip"])
    return made[hosts]
  return get


@pytest.mark.parametrize("hosts", [2, 4])
def test_barrier_broadcast_allgather_round_trip(roundtrip, hosts):
  """Invariant 2: barriers, broadcasts and allgathers of Python values go through the KV store."""
  r = roundtrip(hosts)
  assert r.returncode == 0, r.transcript
  for h in range(hosts):
    assert json.loads(host_lines(r, h, "BCAST")[0]) == {"seed": 1234, "arr": [[0, 1, 2], [3, 4, 5]]}
    assert json.loads(host_lines(r, h, "GATHER")[0]) == [{"host": i, "sq": i * i} for i in range(hosts)]
    assert json.loads(host_lines(r, h, "CALL")[0]) == "leader-0"
    assert json.loads(host_lines(r, h, "LEADER_ONLY")[0]) == ("wrote metrics" if h == 0 else None)
    hello = [l for l in r.transcript.splitlines() if "hello from the worker" in l and l.startswith(f"[host {h}/")]
    assert len(hello) == 1 and hello[0].startswith(f"[host {h}/{hosts}] I ") and hello[0].count("[host") == 1


def test_keys_are_cleaned_up(roundtrip):
  """Thirty rounds of each call under one name leave a bounded number of keys behind (the round-trip launch's)."""
  r = roundtrip(2)
  assert r.returncode == 0, r.transcript
  keys = json.loads(host_lines(r, 0, "KEYS")[0])
  assert keys <= 12, f"{keys} keys left under jaxpod/ after 90 calls: generations are not deleted"


def _peer_failed(r, host):
  lines = host_lines(r, host, "PEERFAILED")
  assert lines, f"host {host} did not raise PeerFailed:\n{r.transcript}"
  return json.loads(lines[0])


def test_leader_failing_before_broadcast_makes_others_raise_peer_failed(launch_hosts):
  """Invariant 3: the leader's exception reaches every waiting host, naming host 0."""
  r = launch_hosts(WORKER, hosts=4, devices_per_host=1, args=["leader_fails_before_broadcast"], timeout_s=120)
  assert r.returncode != 0
  for h in (1, 2, 3):
    info = _peer_failed(r, h)
    assert info["host"] == 0 and info["type"] == "ValueError" and "/nope.jsonl" in info["message"]


def test_broadcast_call_carries_the_leaders_error(launch_hosts):
  """A leader-side error inside broadcast_call is delivered as the payload: no host waits for a value."""
  r = launch_hosts(WORKER, hosts=2, devices_per_host=1, args=["leader_fn_raises_in_broadcast_call"])
  assert r.returncode != 0
  info = _peer_failed(r, 1)
  assert info == {"host": 0, "type": "FileNotFoundError", "message": "tokenizer.json missing in /models/x"}
  assert "FileNotFoundError" in r.host_output(0)


def test_host_raising_mid_run_is_named_by_every_other_host(launch_hosts):
  """Invariant 3: a host that raises publishes (host, type, message); the others raise PeerFailed."""
  r = launch_hosts(WORKER, hosts=4, devices_per_host=1, args=["host_raises_mid_run"])
  assert r.returncode != 0
  for h in (0, 2, 3):
    info = _peer_failed(r, h)
    assert (info["host"], info["type"], info["message"]) == (1, "RuntimeError", "NaN loss at step 7")


def test_host_dying_without_a_word_stops_the_launch_naming_it(launch_hosts):
  """Invariant 3: os._exit -> the launcher exits non-zero naming the host, within its deadline.

  The deadline (start-up allowance + heartbeat 5 s + grace 3 s + 5 s) is a hang detector, not a
  timing assertion: a hang ends as reason 'timeout' and fails this test.
  """
  r = launch_hosts(WORKER, hosts=3, devices_per_host=1, args=["os_exit"], grace_s=3, timeout_s=60 + 5 + 3 + 5)
  assert r.reason == "exit", r.transcript
  assert r.first_failed == 1 and r.returncode == 7
  assert "host 1/3 failed first (exit code 7)" in r.transcript


def test_barrier_timeout_names_the_barrier(launch_hosts):
  """Nothing hangs forever: a barrier that a host never reaches times out with its name."""
  r = launch_hosts(WORKER, hosts=2, devices_per_host=1, args=["barrier_timeout"], grace_s=1)
  msg = host_lines(r, 0, "TIMEOUT")
  assert msg and "late.host" in msg[0] and "host 0/2" in msg[0], r.transcript


@pytest.mark.parametrize("switch", ["code", "env"])
def test_program_check_names_function_and_host(launch_hosts, switch):
  """Invariant 1: a host-dependent shape is caught before running, on every host, with names.

  Switched on by `program_check.enable(True)` in the script, or by JAXPOD_PROGRAM_CHECK=1 alone."""
  env = {"JAXPOD_PROGRAM_CHECK": "1"} if switch == "env" else {}
  r = launch_hosts(WORKER, hosts=2, devices_per_host=1, args=["program_check"], env=env)
  for h in (0, 1):
    assert host_lines(r, h, "SAME_OK") == ["true"], r.transcript
    assert not host_lines(r, h, "MISMATCH_NOT_CAUGHT"), r.transcript
    msg = json.loads(host_lines(r, h, "PROGRAM_MISMATCH")[0])
    assert "'train_step'" in msg and "hosts [1]" in msg and "first difference at line" in msg
    assert "4x8" in msg and "5x8" in msg
