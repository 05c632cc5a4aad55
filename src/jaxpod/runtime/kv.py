"""The one place that touches JAX's private coordination-service client.

Every other module uses these functions, so a change in the private API is fixed here.
Values are str or bytes. A get that times out raises `KVTimeout` (the job survives).
"""
from __future__ import annotations


class KVTimeout(TimeoutError):
  """A blocking get or barrier on the coordination service ran past its deadline."""


def client():
  """The live coordination client, or a clear error when jax.distributed is not initialised."""
  from jax._src.distributed import global_state  # private: wrapped only here
  if global_state.client is None:
    raise RuntimeError("the JAX coordination service is not running; call jaxpod.runtime.init() first "
                       "(one process needs no control plane)")
  return global_state.client


def available() -> bool:
  """True when a coordination client exists (multi-process job)."""
  from jax._src.distributed import global_state
  return global_state.client is not None


def _is_deadline(e: Exception) -> bool:
  text = str(e)
  return "DEADLINE_EXCEEDED" in text or "Deadline Exceeded" in text


# Largest value this process has put in the store: the control plane carries small messages only
# (invariant 2); tests read it to show that data (corpora, prompt sets) goes through storage instead.
MAX_VALUE_BYTES = 0


def set(key: str, value: str | bytes, overwrite: bool = False) -> None:  # noqa: A001
  """Set a key; without `overwrite` a second set of the same key raises."""
  global MAX_VALUE_BYTES
  MAX_VALUE_BYTES = max(MAX_VALUE_BYTES, len(value))
  c = client()
  if isinstance(value, bytes):
    c.key_value_set_bytes(key, value, allow_overwrite=overwrite)
  else:
    c.key_value_set(key, value, allow_overwrite=overwrite)


def get(key: str, timeout_s: float, as_bytes: bool = False) -> str | bytes:
  """Wait up to `timeout_s` for a key to exist and return its value."""
  c = client()
  ms = max(1, int(timeout_s * 1000))
  try:
    return c.blocking_key_value_get_bytes(key, ms) if as_bytes else c.blocking_key_value_get(key, ms)
  except Exception as e:  # XlaRuntimeError / JaxRuntimeError
    if _is_deadline(e):
      raise KVTimeout(f"key {key!r} not set within {timeout_s:.3g}s") from None
    raise


def try_get(key: str, as_bytes: bool = False) -> str | bytes | None:
  """The value of a key, or None if it does not exist."""
  c = client()
  try:
    return c.key_value_try_get_bytes(key) if as_bytes else c.key_value_try_get(key)
  except Exception as e:
    if "NOT_FOUND" in str(e) or "not found" in str(e).lower():
      return None
    raise


def dir_get(prefix: str, as_bytes: bool = False) -> list[tuple[str, str | bytes]]:
  """All (key, value) pairs under a directory prefix (no trailing slash needed)."""
  c = client()
  prefix = prefix.rstrip("/") + "/"
  return list(c.key_value_dir_get_bytes(prefix) if as_bytes else c.key_value_dir_get(prefix))


def increment(key: str, by: int = 1) -> int:
  """Atomically add to an integer key (created at 0) and return the new value."""
  return int(client().key_value_increment(key, by))


def delete(key: str) -> None:
  """Delete a key, or a whole directory of keys."""
  client().key_value_delete(key)


def raw_barrier(barrier_id: str, timeout_s: float) -> None:
  """The coordination service's own barrier (used by benchmarks as the baseline)."""
  try:
    client().wait_at_barrier(barrier_id, max(1, int(timeout_s * 1000)))
  except Exception as e:
    if _is_deadline(e):
      raise KVTimeout(f"barrier {barrier_id!r} not reached within {timeout_s:.3g}s") from None
    raise

