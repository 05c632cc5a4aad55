"""Opt-in check that every host is about to run the same program.

Hosts that run different executables (a host-dependent shape, a host-only code path, a
different order) crash a TPU pod with "unexpected peer ... different launch id", or hang
gloo collectives forever. With the check on, `runtime.jit` hashes the lowered program text
of each new call signature and compares it across hosts through the key-value store
before running it; a mismatch raises `ProgramMismatch` on every host naming the function,
the hosts that differ and the first differing line.

Switch it on without editing code: `JAXPOD_PROGRAM_CHECK=1` in every host's environment
(read by `runtime.init`), or `--runtime.program_check true` on the command line.
"""
from __future__ import annotations

import base64
import functools
import os
import hashlib
import zlib
from typing import Any, Callable

import jax

from jaxpod.runtime import control, state
from jaxpod.runtime.log import get_logger

log = get_logger("program_check")
_ENABLED = False
ENV_VAR = "JAXPOD_PROGRAM_CHECK"  # "1" / "true" / "yes" / "on" turns the check on in runtime.init
_CHANNEL = "jaxpod.program_check"  # one channel for every function, so a different function is caught too


class ProgramMismatch(RuntimeError):
  """Hosts are about to run different programs."""


def enable(flag: bool = True) -> None:
  """Turn the cross-host program check on or off for this process."""
  global _ENABLED
  _ENABLED = bool(flag)


def enabled() -> bool:
  """Whether the check is on in this process."""
  return _ENABLED


def env_enabled() -> bool:
  """True when JAXPOD_PROGRAM_CHECK asks for the check; an unrecognised value is an error naming it."""
  value = os.environ.get(ENV_VAR, "").strip().lower()
  if value in ("", "0", "false", "no", "off"):
    return False
  if value in ("1", "true", "yes", "on"):
    return True
  raise ValueError(f"{ENV_VAR}={os.environ[ENV_VAR]!r}: use 1 to turn the cross-host program check on, 0 (or unset) "
                   "to leave it off")


def _first_difference(a: str, b: str) -> tuple[int, str, str]:
  la, lb = a.splitlines(), b.splitlines()
  for i, (x, y) in enumerate(zip(la, lb)):
    if x != y:
      return i + 1, x.strip(), y.strip()
  i = min(len(la), len(lb))
  return i + 1, (la[i].strip() if i < len(la) else "<end>"), (lb[i].strip() if i < len(lb) else "<end>")


def _pack(text: str) -> str:
  return base64.b64encode(zlib.compress(text.encode(), 6)).decode()


def _unpack(blob: str) -> str:
  return zlib.decompress(base64.b64decode(blob)).decode()


def verify(name: str, program_text: str, timeout_s: float | None = None) -> None:
  """Compare (name, hash of program_text) across hosts; raise ProgramMismatch on every host if any differ."""
  if not state.in_multi_process_job():
    return
  digest = hashlib.sha256(program_text.encode()).hexdigest()
  seen = control.allgather([name, digest], _CHANNEL, timeout_s)
  if all(s == seen[0] for s in seen):
    return
  other = next(i for i, s in enumerate(seen) if s != seen[0])
  me = state.host_info().process_index
  texts = control.allgather(_pack(program_text) if me in (0, other) else None, _CHANNEL + ".text", timeout_s)
  differing = [i for i, s in enumerate(seen) if s != seen[0]]
  names = {i: s[0] for i, s in enumerate(seen)}
  if names[other] != names[0]:
    detail = f"host 0 runs {names[0]!r} but host {other} runs {names[other]!r}"
  else:
    line, a, b = _first_difference(_unpack(texts[0]), _unpack(texts[other]))
    detail = f"first difference at line {line}:\n  host 0:     {a[:300]}\n  host {other}: {b[:300]}"
  raise ProgramMismatch(f"hosts are about to run different programs for {name!r}: hosts {differing} differ from "
                        f"host 0; {detail}\nEvery size and input must be decided on the leader and broadcast.")


def _signature(args, kwargs) -> str:
  """Shapes, dtypes and partition specs of the arguments (no device ids: those differ per host)."""
  def describe(x):
    if hasattr(x, "shape") and hasattr(x, "dtype"):
      sharding = getattr(x, "sharding", None)
      return (tuple(x.shape), str(x.dtype), type(sharding).__name__, str(getattr(sharding, "spec", "")))
    return repr(x)
  leaves, tree = jax.tree.flatten((args, kwargs))
  return hashlib.sha256(repr((tree, [describe(x) for x in leaves])).encode()).hexdigest()[:32]


def jit(fn: Callable[..., Any] | None = None, *, name: str | None = None, **jit_kwargs):
  """`jax.jit` that, with the program check on, verifies each call against the other hosts first.

  Every checked call exchanges (function name, argument signature) through the key-value
  store (~1 ms), so all hosts agree on whether to compare programs; a new or differing
  signature lowers the function and compares the program text. Off by default.
  """
  if fn is None:
    return functools.partial(jit, name=name, **jit_kwargs)
  jitted = jax.jit(fn, **jit_kwargs)
  label = name or getattr(fn, "__qualname__", repr(fn))
  checked: set[str] = set()

  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    if _ENABLED and state.in_multi_process_job():
      sig = _signature(args, kwargs)
      seen = control.allgather([label, sig], _CHANNEL + ".signature")
      same = all(s == seen[0] for s in seen)
      if not same or sig not in checked:  # the same decision on every host: `seen` is shared
        verify(label, jitted.lower(*args, **kwargs).as_text())
        checked.add(sig)
    return jitted(*args, **kwargs)

  wrapper.lower = jitted.lower
  wrapper.jitted = jitted
  return wrapper
