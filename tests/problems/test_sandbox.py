"""The code tool's sandbox (`problems.sandbox`): the file-size limit is named as such, and the program's /proc is
its PID namespace's (the other limits: tests/rl/test_python_env.py)."""
import os

import pytest

from jaxpod.problems.sandbox import SandboxLimits, containment, run_python

LIMITS = SandboxLimits(timeout_s=5.0, cpu_s=3)  # file_mb: the default 8 MiB
BARE = SandboxLimits(timeout_s=5.0, cpu_s=3, namespaces=False)


@pytest.mark.parametrize("limits", [LIMITS, BARE], ids=["namespaces", "bare"])
def test_a_file_past_the_size_limit_ends_the_program_with_the_file_size_note(limits):
  """RLIMIT_FSIZE's signal, which Python ignores by default (it was `OSError: [Errno 27] File too large`, status
  error): now status file_size and its note, with or without namespaces."""
  outcome = run_python("open('big', 'wb').write(b'x' * (9 << 20))\nprint('after')", limits)
  assert (outcome.status, outcome.observation) == ("file_size", "[file size limit: 8 MiB]\n"), outcome


def test_stdout_past_the_size_limit_is_truncated_and_names_the_limit():
  """stdout is a file too: its head comes back, then both notes (it was `[output truncated]` alone)."""
  outcome = run_python("print('y' * (9 << 20))", LIMITS)
  assert outcome.status == "file_size", outcome
  assert outcome.observation == "y" * 256 + "[output truncated]\n[file size limit: 8 MiB]\n"


def test_a_program_that_ignores_the_signal_still_meets_the_file_size_limit():
  program = ("import signal\nsignal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
             "open('big', 'wb').write(b'x' * (9 << 20))")
  outcome = run_python(program, LIMITS)
  assert outcome.status == "file_size", outcome
  assert outcome.observation == "OSError: [Errno 27] File too large\n[file size limit: 8 MiB]\n"


def test_the_program_sees_only_its_own_processes_in_proc():
  """A fresh /proc in the PID namespace (`--mount-proc`): a program that gets past the audit hook (os.stat raises
  no audit event) finds this process's pid and the machine's other processes absent, and is pid 2 itself (its
  init is 1); the bare sandbox shows the machine's processes, as the namespaces did before."""
  assert "own /proc" in containment(LIMITS), containment(LIMITS)  # this machine allows it; docs say when not
  probe = (f"import os\nprint(os.path.exists('/proc/{os.getpid()}'), os.readlink('/proc/self'), "
           "sum(os.path.exists(f'/proc/{p}') for p in range(1, 4096)))")
  assert run_python(probe, LIMITS).observation == "False 2 2\n"
  seen, me, count = run_python(probe, BARE).observation.split()
  assert seen == "True" and int(me) > 2 and int(count) > 2


def test_listing_a_folder_outside_the_scratch_directory_is_refused():
  """Listing is reading: /proc (the machine's, where its own cannot be mounted) is refused like opening a file."""
  for limits in (LIMITS, BARE):
    outcome = run_python("import os\nprint(os.listdir('/proc'))", limits)
    assert outcome.observation == "PermissionError: [read outside the scratch directory refused]\n", outcome
    assert run_python("import os\nopen('a', 'w')\nprint(os.listdir(), os.listdir('.'))", limits).observation == (
        "['a'] ['a']\n")
