"""`jaxpod rl --role auto` supervising its clusters (`rl.launch.supervise`), with stand-in programs for the
trainer and the workers (real processes under jaxpod's launcher; no JAX): a preempted run stops its workers at
once and exits 143 (a preemption notice leaves ~30 s; waiting for workers to notice an end a preempted trainer
never announces took 64 s, issue 25)."""
import subprocess
import sys
import textwrap

# A trainer that saves on SIGTERM (exit 143) or, given "preempt", is preempted by itself after 0.5 s.
TRAINER = """
import signal, sys, time
def saved(*_):
  print("trainer: saved", flush=True)
  sys.exit(143)
signal.signal(signal.SIGTERM, saved)
print("trainer: running", flush=True)
if sys.argv[1:] == ["preempt"]:
  time.sleep(0.5)
  saved()
while True:
  time.sleep(0.1)
"""
WORKER = """
import time
print("worker: running", flush=True)
while True:
  time.sleep(0.1)
"""
SUPERVISE = """
import sys
from jaxpod.rl.disaggregated import launch
from jaxpod.runtime.launcher import LaunchConfig
launch.WORKERS_GRACE_S = 3600.0  # a supervisor that waits for the workers after a preempted trainer hangs here
root, trainer_args = sys.argv[1], sys.argv[2:]
cluster = lambda name, code, *args: ([sys.executable, "-c", code, *args], LaunchConfig(
    hosts=1, devices_per_host=1, log_dir=f"{root}/{name}", label=f"{name} ", grace_s=5.0))
sys.exit(launch.supervise({"trainer": cluster("trainer", %r, *trainer_args), "worker0": cluster("worker0", %r)}))
""" % (TRAINER, WORKER)


def _supervisor(tmp_path, *trainer_args):
  return subprocess.Popen([sys.executable, "-c", textwrap.dedent(SUPERVISE), str(tmp_path), *trainer_args],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_a_trainer_preempted_on_its_own_stops_the_workers_and_exits_143(tmp_path):
  proc = _supervisor(tmp_path, "preempt")
  out, _ = proc.communicate(timeout=120)  # a hang guard: without the fix the supervisor waits an hour
  assert proc.returncode == 143, out
  assert "trainer: saved" in out and "stopping the rollout workers now" in out, out


def test_sigterm_to_the_run_lets_the_trainer_save_stops_the_workers_and_exits_143(tmp_path):
  proc = _supervisor(tmp_path)
  seen = []
  for line in proc.stdout:  # both clusters started
    seen.append(line)
    if sum("running" in l for l in seen) == 2:
      break
  proc.terminate()
  out, _ = proc.communicate(timeout=120)
  out = "".join(seen) + out
  assert proc.returncode == 143, out
  assert "trainer: saved" in out, out  # the trainer's hosts got the SIGTERM (time to save), not a SIGKILL
