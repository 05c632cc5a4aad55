"""The progress watchdog (`runtime.watchdog`, `runtime.progress`): a host alive but stuck is named and every host
exits; the stall limit's rules; how compile and waits are told apart from a stall."""
import io
import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from jaxpod.runtime import progress, watchdog
from jaxpod.runtime.launcher import LaunchConfig, launch
from jaxpod.runtime.state import RuntimeConfig

REPO = Path(__file__).resolve().parents[2]
WORKERS = Path(__file__).parent / "workers"
STALL_S = 10  # the launched tests' runtime.stall_timeout_s: long enough for a tiny step on a loaded machine


class Clock:
  """A monotonic clock the test moves."""

  def __init__(self):
    self.now = 1000.0

  def __call__(self) -> float:
    return self.now


@pytest.fixture
def clock(monkeypatch):
  c = Clock()
  monkeypatch.setattr(progress.time, "monotonic", c)
  progress.arm()
  yield c
  progress.disarm()


def _steps(clock, *seconds):
  for s in seconds:
    clock.now += s
    progress.mark("train step", step=True)


def test_default_limit_is_the_floor_until_ten_steps_take_longer(clock):
  cfg = RuntimeConfig()
  _steps(clock, 0, 2, 3)
  assert watchdog.limit_s(cfg, progress.STATE) == watchdog.STALL_FLOOR_S
  _steps(clock, 100)
  assert watchdog.limit_s(cfg, progress.STATE) == 10 * 100
  assert watchdog.limit_s(RuntimeConfig(stall_timeout_s=5), progress.STATE) == 5  # a stated limit is the limit


def test_a_step_that_held_a_compile_is_not_a_step_time(clock):
  """The first step compiles for 20 minutes: its interval would make the limit 200 minutes."""
  _steps(clock, 0)
  clock.now += 1200
  progress.compile_ended()
  _steps(clock, 1, 2)
  assert progress.STATE.longest_step_s == 2
  assert progress.STATE.last == clock.now  # the end of a compile was progress too


def test_an_allowed_block_raises_the_limit_to_its_deadline_and_only_inside(clock):
  cfg = RuntimeConfig(stall_timeout_s=30)
  with progress.allow(3600):  # e.g. the others waiting in a broadcast for the leader's dataset
    with progress.allow(120):
      assert watchdog.limit_s(cfg, progress.STATE) == 3600
    assert watchdog.limit_s(cfg, progress.STATE) == 3600
  assert watchdog.limit_s(cfg, progress.STATE) == 30


def test_marks_from_another_thread_are_not_progress(clock):
  """A helper thread that keeps working while the main thread is stuck must not hide the stall."""
  progress.mark("main phase")
  before = progress.STATE.last
  clock.now += 50
  t = threading.Thread(target=lambda: (progress.mark("helper"), progress.touch(), progress.detail("x")))
  t.start()
  t.join()
  assert progress.STATE.last == before and progress.STATE.phase == "main phase"
  progress.detail("wave 2")
  assert progress.STATE.phase == "main phase, wave 2" and progress.STATE.last == clock.now


def test_a_stack_inside_jax_tracing_is_compiling_and_one_outside_is_not():
  """Compile is told apart from a stall by the main thread's stack: a frame of JAX's trace, lowering or compile
  modules (`watchdog.COMPILE_FILES`) means it is compiling (XLA's compile sits in `jax/_src/compiler.py`)."""
  import jax
  seen = {}

  def traced(x):
    seen["frames"] = watchdog._frames(sys._getframe())
    return x + 1

  jax.jit(traced)(1.0)
  assert watchdog.compiling(seen["frames"])
  assert not watchdog.compiling(watchdog._frames(sys._getframe()))


def blocked_here(event):
  event.wait()


def test_where_names_the_code_that_waits_not_the_standard_librarys_wait():
  event = threading.Event()
  t = threading.Thread(target=blocked_here, args=(event,))
  t.start()
  try:
    for _ in range(500):
      frames = watchdog._frames(sys._current_frames()[t.ident])
      if frames and frames[0].f_code.co_name == "wait":
        break
      time.sleep(0.01)
    place = watchdog.where(frames)
    assert place.startswith(f"{__file__.replace(os.sep, '/')}:") and place.endswith("(blocked_here)"), place
  finally:
    event.set()
    t.join()


def test_launch_summary_names_the_stuck_host_when_the_host_waiting_for_it_exits_first(tmp_path):
  """Stand-ins for two hosts (no JAX): host 0 exits first on host 1's notice, host 1 said it was stuck."""
  stuck = f"{watchdog.NOTICE}host 1 made no progress for 10 s in rl rollout for step 1, at reward.py:16 (reward)"
  code = ("import os, sys, time\n"
          "if os.environ['JAXPOD_PROCESS_ID'] == '1':\n"
          f"  print({stuck!r}, flush=True); time.sleep(5); sys.exit(1)\n"
          "time.sleep(1)\n"
          f"print({watchdog.NOTICE!r} + 'host 0 exits: host 1 failed: Stalled: ...; it was in x, at y', flush=True)\n"
          "sys.exit(1)\n")
  summary = io.StringIO()
  r = launch([sys.executable, "-c", code], LaunchConfig(hosts=2, log_dir=str(tmp_path)), sink=None, summary=summary)
  assert r.first_failed == 0
  first = summary.getvalue().splitlines()[0]
  assert first == "jaxpod launch: " + stuck.removeprefix(watchdog.NOTICE), summary.getvalue()


def _launch(cmd, tmp_path, devices_per_host: int = 1, timeout_s: float = 300):
  """cmd on 2 isolated hosts; a long SIGKILL grace, so a host that exits did so by itself (its watchdog)."""
  cfg = LaunchConfig(hosts=2, devices_per_host=devices_per_host, log_dir=str(tmp_path / "logs"), grace_s=120,
                     timeout_s=timeout_s, shared_local_disk=True)
  env = dict(os.environ, PYTHONPATH=str(REPO))
  env.pop("JAX_NUM_CPU_DEVICES", None)
  transcript = io.StringIO()
  result = launch(cmd, cfg, sink=transcript, summary=transcript, env=env)
  return result, transcript.getvalue(), time.time()


def _summary(text: str) -> str:
  """The first line of the launcher's summary."""
  return next(l for l in text.splitlines() if l.startswith("jaxpod launch: "))


def _stuck_at(result, host: int, tag: str) -> float:
  return float(next(l.split()[1] for l in result.output[host] if l.startswith(tag)))


@pytest.mark.slow
@pytest.mark.multihost
def test_a_reward_plugin_stuck_on_host_1_ends_every_host_and_names_host_1(tmp_path):
  """Issue 51's reproduction: `jaxpod launch --hosts 2 -- jaxpod rl` with a reward plugin that blocks forever on
  host 1 after 40 calls. Before the watchdog: both logs stopped at the first GRPO step and nothing was printed
  until host 0's control-plane deadline (600 s), naming no host. Now host 1 writes its threads' stacks, names
  itself, its phase and the plugin's line, and every host exits 1 by itself; the summary's first line says it."""
  from tests.rl.clusters import TINY
  cmd = [sys.executable, "-m", "jaxpod.cli.main", "rl", *TINY, "--warmup.steps", "0", "--trainer.steps", "3",
         "--trainer.eval_at_start", "false", "--trainer.runs_dir", str(tmp_path / "runs"),
         "--rewards", "[tests.runtime.workers.stuck_reward:reward]", "--runtime.stall_timeout_s", str(STALL_S)]
  result, text, ended = _launch(cmd, tmp_path)
  assert result.exit_codes == [1, 1], text[-4000:]  # both exited by themselves, none killed, no timeout
  stuck = _stuck_at(result, 1, "STUCK")
  named = _summary(text)
  assert named.startswith("jaxpod launch: host 1 made no progress for ") and " s in rl rollout for step 1, at " in named
  assert named.endswith("tests/runtime/workers/stuck_reward.py:16 (reward)"), named
  host1 = "\n".join(result.output[1])
  assert "Thread MainThread (main" in host1 and "Thread jaxpod-watchdog" in host1  # every thread's stack
  assert any("host 1 failed" in l and "made no progress" in l for l in result.output[0]), text[-4000:]
  print(f"stall -> every host exited: {ended - stuck:.1f} s (runtime.stall_timeout_s={STALL_S})")
  assert ended - stuck < STALL_S + 30  # the bound: a hang guard, not a speed


def _export(tmp_path, mode: str, host: int = 1):
  cmd = [sys.executable, str(WORKERS / "stuck_export_worker.py"), str(tmp_path / "hf"), mode, str(STALL_S), str(host)]
  return _launch(cmd, tmp_path, devices_per_host=2, timeout_s=240)


@pytest.mark.slow
@pytest.mark.multihost
def test_a_host_stuck_inside_the_hf_export_is_named_and_the_host_in_the_all_to_all_exits(tmp_path):
  """Host 1 blocks after receiving its first tensor; host 0 goes on to the next wave's all-to-all and waits in
  the device collective. Both pass their limits in the same poll; host 1, whose last progress is older, is named
  (wave 1, the worker's line), and host 0 exits 1 on its notice: by its watchdog, or, when host 1's exit breaks
  the gloo collective first (CPU only; a TPU's waits on), leaving without the shutdown barrier."""
  result, text, ended = _export(tmp_path, "stall")
  assert result.exit_codes == [1, 1], text[-4000:]
  named = _summary(text)
  assert named.startswith("jaxpod launch: host 1 made no progress for "), text[-4000:]
  assert " s in HF export, gathering arrays to their writers, wave 1, at " in named, named
  assert "tests/runtime/workers/stuck_export_worker.py:" in named and named.endswith("(goes_wrong)"), named
  by_watchdog = [l for l in result.output[0] if l.startswith(f"{watchdog.NOTICE}host 0 exits: host 1 failed: "
                                                                "Stalled: host 1 made no progress")]
  at_exit = [l for l in result.output[0] if "leaving the job without its shutdown barrier (host 1, stuck" in l]
  assert by_watchdog or at_exit, text[-4000:]
  assert all("it was in HF export, gathering arrays to their writers, wave 2" in l for l in by_watchdog)
  print(f"stall -> every host exited: {ended - _stuck_at(result, 1, 'WRONG'):.1f} s")


@pytest.mark.slow
@pytest.mark.multihost
def test_a_stuck_leader_outlives_the_others_so_they_read_its_notice(tmp_path):
  """Host 0 runs the coordination service: exiting at once would end the others by JAX's abort before their
  watchdogs read its notice. It waits for them: host 1 exits 1 with host 0's notice, then host 0 exits 1."""
  result, text, _ = _export(tmp_path, "stall", host=0)
  assert result.exit_codes == [1, 1], text[-4000:]
  assert _summary(text).startswith("jaxpod launch: host 0 made no progress for "), text[-4000:]
  assert any("host 0 failed" in l and "host 0 made no progress" in l for l in result.output[1]), text[-4000:]


@pytest.mark.slow
@pytest.mark.multihost
def test_a_host_failing_inside_the_hf_export_ends_the_host_left_in_the_all_to_all(tmp_path):
  """Host 1 raises inside the export: it publishes the failure, but host 0 sits in the next wave's all-to-all (no
  control-plane call to notice it in; on a TPU it would wait forever). Host 0's watchdog reads the notice while
  the main thread is in the collective and exits 1 by itself, naming host 1's error and where host 0 was."""
  result, text, _ = _export(tmp_path, "raise")
  assert result.exit_codes[0] == 1, text[-4000:]
  [line] = [l for l in result.output[0] if l.startswith(watchdog.NOTICE)]
  assert line.startswith(f"{watchdog.NOTICE}host 0 exits: host 1 failed: OSError: injected: the bucket refused"), line
  assert "it was in HF export, gathering arrays to their writers, wave 2, at " in line, line
  assert _summary(text).startswith("jaxpod launch: host 1 failed: OSError: injected"), text[-2000:]


@pytest.mark.multihost
def test_a_long_compile_on_one_host_is_no_false_alarm_on_the_host_waiting_for_it(tmp_path):
  """Host 0 compiles (traces) for 3x the stall limit; host 1 is past its own limit in the program's collective,
  waiting for it. Host 0's stack is in JAX's trace (compile_timeout_s applies) and it says so on the control plane
  (`jaxpod/busy/0`), so host 1 waits for it instead of calling itself stuck: both end the sum and exit 0."""
  stall_s = 2
  cmd = [sys.executable, str(WORKERS / "slow_compile_worker.py"), str(stall_s), str(3 * stall_s)]
  result, text, _ = _launch(cmd, tmp_path, timeout_s=120)
  assert result.exit_codes == [0, 0], text[-4000:]
  assert all(f"SUM {2.0}" in result.output[h] for h in (0, 1)), text[-4000:]
  assert not any(watchdog.NOTICE in l for out in result.output for l in out), text[-4000:]
  assert any("host 0 is compiling" in l for l in result.output[1]), text[-4000:]  # host 1 was past its limit
