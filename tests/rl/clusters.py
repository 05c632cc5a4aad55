"""Launched `jaxpod rl` clusters for tests: each in a thread, its echoed lines readable while it runs."""
from __future__ import annotations

import io
import os
import sys
import threading
import time
from pathlib import Path

from jaxpod.runtime.launcher import LaunchConfig, launch

SCRIPT = Path(__file__).parent / "workers" / "jaxpod_rl.py"
# One-digit addition on a tiny policy: the smallest problem on which GRPO runs end to end. Held-out greedy accuracy
# after a 200-step warm-up is memorization (0-50% by seed and CPU); what RL reliably lifts is a teacher's habit
# (`period_policy`, tests/rl/conftest.py).
TINY = ["--problems.type", "addition", "--problems.digits", "1", "--problems.eval_size", "32",
        "--model.hidden_size", "64", "--model.intermediate_size", "128", "--model.num_hidden_layers", "2",
        "--rollout.max_prompt_len", "8", "--rollout.max_new_tokens", "4", "--rollout.batch_size", "64",
        "--rollout.eval_slots", "32", "--grpo.num_prompts_per_step", "8", "--grpo.num_generations", "8",
        "--grpo.lr", "3e-4", "--grpo.sample_prompts_per_step", "0", "--grpo.filter_groups", "false",
        "--rollout.temperature", "1.0", "--rollout.groups_per_file", "4", "--trainer.progress", "false"]
# The calculator's episodes (`--problems.type calculator`, two-digit factors) on the same tiny policy: the shapes of
# `calculator_run` (its warm-up export is `calculator_policy`) and of the 2-host colocated test's episodes.
CALCULATOR = ["--problems.type", "calculator", "--problems.digits", "2", "--problems.eval_size", "32",
              "--problems.teacher_skip_tool", "0.6", "--model.hidden_size", "64", "--model.intermediate_size", "128",
              "--model.num_hidden_layers", "2", "--rollout.max_prompt_len", "36", "--rollout.max_new_tokens", "12",
              "--rollout.batch_size", "64", "--rollout.eval_slots", "32", "--grpo.num_prompts_per_step", "8",
              "--grpo.num_generations", "8", "--grpo.sample_prompts_per_step", "0", "--grpo.filter_groups", "false",
              "--grpo.lr", "2e-3", "--trainer.progress", "false"]

class Cluster:
  """A `jaxpod launch`-style cluster running `jaxpod rl ARGS` in a thread; its echoed lines are readable live."""

  def __init__(self, name: str, args: list[str], log_dir: Path, hosts: int = 1, grace_s: float = 60.0,
               env: dict | None = None):
    self.name, self.lines, self.result = name, [], None
    self.stop = threading.Event()
    cfg = LaunchConfig(hosts=hosts, devices_per_host=1, log_dir=str(log_dir / name), grace_s=grace_s,
                       hosts_root=str(log_dir / name / "hosts"), label=f"{name} ", timeout_s=600)
    full_env = dict(os.environ, **(env or {}))
    full_env.pop("JAX_NUM_CPU_DEVICES", None)
    full_env.pop("JAXPOD_COMPILE_CACHE", None)
    sink = _Lines(self.lines)
    self._thread = threading.Thread(
        target=lambda: setattr(self, "result", launch([sys.executable, str(SCRIPT), *args], cfg, sink=sink,
                                                      summary=sink, env=full_env, stop=self.stop)), daemon=True)
    self._thread.start()

  def wait_for(self, text: str, timeout_s: float = 300.0) -> str:
    """The first echoed line containing `text` (fails the test after timeout_s, or when the cluster ended)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
      hit = next((l for l in list(self.lines) if text in l), None)
      if hit is not None:
        return hit
      if not self._thread.is_alive():
        break
      time.sleep(0.2)
    raise AssertionError(f"{self.name}: no line with {text!r}; last lines:\n" + "\n".join(self.lines[-30:]))

  def join(self, timeout_s: float = 600.0):
    self._thread.join(timeout_s)
    assert not self._thread.is_alive(), f"{self.name} did not end"
    return self.result

  def text(self) -> str:
    return "\n".join(self.lines)


class _Lines(io.TextIOBase):
  def __init__(self, lines: list):
    self.lines = lines

  def write(self, s: str) -> int:
    self.lines.extend(l for l in s.splitlines() if l)
    return len(s)
