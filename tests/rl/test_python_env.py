"""The python tool: programs a policy writes run in a sandbox that contains loops, fork bombs, huge allocations,
network connections and writes outside its scratch directory, reports each as an observation, leaves no process
behind, and answers the same program the same way every time (every host runs it: invariant 1's same inputs)."""
import types

import pytest

from jaxpod.models.llama import ByteTokenizer
from jaxpod.problems.base import Problem
from jaxpod.problems.python_tool import PythonProblems, PythonTool, observe
from jaxpod.problems.sandbox import MARKER, SandboxLimits, live_processes, run_python

TOK = ByteTokenizer()
FAST = SandboxLimits(timeout_s=1.0, cpu_s=3)


def _sandbox_processes() -> list[int]:
  """Live processes that carry a sandbox run's marker in their environment."""
  found = []
  for pid in live_processes():
    try:
      with open(f"/proc/{pid}/environ", "rb") as f:
        if MARKER.encode() + b"=" in f.read():
          found.append(pid)
    except OSError:
      pass
  return found


@pytest.mark.parametrize("program, status, note", [
    ("while True:\n  pass", "timeout", "[timeout after 1.0 s]"),
    ("import time\ntime.sleep(30)", "timeout", "[timeout after 1.0 s]"),
    ("import os\nwhile True:\n  os.fork()", "error", "PermissionError: [processes disabled]"),
    ("import subprocess\nsubprocess.run(['sh', '-c', 'sleep 30 &'])", "error", "[module _posixsubprocess disabled]"),
    ("x = bytearray(8 * 1024 ** 3)", "memory", "[memory limit: 256 MiB]"),
    ("import socket\nsocket.create_connection(('10.0.0.1', 80), timeout=1)", "error", "[network disabled]"),
    ("import ctypes", "error", "[module ctypes disabled]"),
])
def test_a_program_past_a_limit_is_stopped_reported_and_leaves_nothing_running(program, status, note):
  outcome = run_python(program, FAST)
  assert outcome.status == status and note in outcome.observation, outcome
  assert _sandbox_processes() == []


def test_the_cpu_limit_stops_a_busy_program_before_the_wall_clock_does():
  outcome = run_python("while True:\n  pass", SandboxLimits(timeout_s=20.0, cpu_s=1))
  assert outcome.status == "cpu" and outcome.observation.endswith("[cpu limit: 1 s]\n"), outcome
  assert _sandbox_processes() == []


def test_writes_stay_in_the_scratch_directory_and_reads_outside_it_are_refused(tmp_path):
  outside = tmp_path / "escaped.txt"
  outcome = run_python(f"open({str(outside)!r}, 'w').write('x')", FAST)
  assert outcome.observation == "PermissionError: [write outside the scratch directory refused]\n"
  assert not outside.exists()
  outcome = run_python(f"import os\nos.remove({str(tmp_path)!r})", FAST)
  assert "[write outside the scratch directory refused]" in outcome.observation and tmp_path.exists()
  assert run_python("print(open('/etc/hostname').read())", FAST).observation == (
      "PermissionError: [read outside the scratch directory refused]\n")
  here = run_python("open('notes.txt', 'w').write('kept')\nprint(open('notes.txt').read())", FAST)
  assert here.observation == "kept\n" and here.status == "ok"
  assert run_python("import os\nprint(os.listdir('.'))", FAST).observation == "[]\n"  # a fresh one per run


def test_output_is_truncated_errors_are_one_line_and_silence_is_said():
  limits = SandboxLimits(max_output_chars=64)
  outcome = run_python("print('x' * 10000)", limits)
  assert outcome.observation == "x" * 64 + "[output truncated]\n" and outcome.status == "ok"
  assert run_python("print(1)\n1/0", limits).observation == "1\nZeroDivisionError: division by zero\n"
  assert run_python("print(", limits).observation.startswith("SyntaxError: ")
  assert run_python("x = 1", limits).observation == "[no output]\n"


def test_the_environment_is_minimal_and_the_same_program_gives_the_same_observation_twice():
  program = ("import os, random\nprint(sorted(k for k in os.environ if k != 'JAXPOD_SANDBOX_RUN'))\n"
             "print({'alpha', 'beta', 'gamma', 'delta'}, hash('abc'), random.random())")
  first, second = run_python(program, FAST), run_python(program, FAST)
  assert first == second and first.status == "ok"
  assert "PROXY" not in first.observation.upper() and first.observation.startswith(
      "['HOME', 'LANG', 'LC_ALL', 'PATH', 'PYTHONDONTWRITEBYTECODE', 'PYTHONHASHSEED', 'PYTHONIOENCODING', 'TMPDIR']")


def test_the_python_environment_runs_programs_and_rewards_the_right_answer():
  """An episode through the real loop: a program run in the sandbox, its output, the copied answer."""
  from jaxpod.policy.rollout.episodes import TurnByTurn, run_episodes
  env = PythonTool(FAST)
  problem = Problem("Compute 12*34.\n", "408")
  assert env.reset(problem) == problem.prompt
  assert env.step("x = 12\nprint(x*34)") == ("408\n", 0.0, False)
  assert env.step("408") == ("", 1.0, True) and env.step("409")[1:] == (0.0, True)
  for program in ("print(4821*7395)", "print(9 - 12)", "print(012*3)", "print(3*0)"):  # in-process or not: the same
    assert observe(program, FAST) == run_python(program, FAST).observation, program
  turns = iter(["print(12*34+0)", "408"])

  def generate(contexts, seeds, n=1, keep=False):  # the engine's signature (n samples per context, KV kept)
    out = []
    for _ in range(len(contexts) * n):
      ids = TOK.encode(next(turns))[1:]
      out.append(types.SimpleNamespace(sampled=ids + [257], logprobs=[-.1] * (len(ids) + 1),
                                       versions=[0] * (len(ids) + 1), tokens=ids))
    return out

  [[e]] = run_episodes(TurnByTurn(generate), TOK, PythonProblems(timeout_s=1.0).environment(), [problem], n=1,
                       max_turns=3, seed=0)
  assert e.solved and e.turns == 2
  eos = TOK.decode([257])
  assert TOK.decode(e.context()) == f"Compute 12*34.\nprint(12*34+0){eos}408\n408{eos}"


def test_jaxpod_rl_task_type_python_parses_and_its_teacher_episodes_fit():
  """The embedded rl_python.yaml: the config checks pass before JAX, and a teacher's episode is solved."""
  from jaxpod.cli.rl import load_config
  from jaxpod.problems.environments import demonstration
  from jaxpod.rl import checks
  cfg = load_config(["--problems.type", "python"])
  assert isinstance(cfg.problems, PythonProblems) and cfg.problems.teacher_skip_tool == 0.6
  checks.before_jax(cfg)
  task = PythonProblems(digits=4)
  problem = task.problem(0, 1, 0)
  e = demonstration(task, TOK, problem, stop_id=257)
  a, b = problem.prompt.removeprefix("Compute ").removesuffix(".\n").split("*")
  assert TOK.decode(e.context()) == (f"{problem.prompt}print({a}*{b}){TOK.decode([257])}{problem.answer}\n"
                                     f"{problem.answer}{TOK.decode([257])}")
  assert e.solved
  with pytest.raises(ValueError, match=r"rl.problems: sandbox memory_mb=16 must be >= 64"):
    PythonProblems(memory_mb=16)


def test_without_namespaces_the_other_layers_give_the_same_observations():
  """A machine without unprivileged user namespaces runs the same programs with rlimits, the process tree and the
  audit hook only: the observations are those of the namespaced sandbox."""
  programs = ["print(6*7)", "x = bytearray(8 * 1024 ** 3)", "import socket", "open('/tmp/x', 'a')",
              "while True:\n  pass"]
  bare = SandboxLimits(timeout_s=1.0, cpu_s=3, namespaces=False)
  assert [run_python(p, bare).observation for p in programs] == [run_python(p, FAST).observation for p in programs]
  assert _sandbox_processes() == []
