"""Per-run secrets for transports that other machines can reach.

Servers bind 127.0.0.1 by default. An `arrow_flight` trainer bound to any other address serves
only clients that present the run's secret, which lives in the environment only: the variable
`JAXPOD_TRANSFER_SECRET` (or the one `TransferConfig.secret_env` names). Configs hold the
variable's name, never the value; nothing here logs or formats the value into a message.

    env = ensure_secret(dict(os.environ))   # a launcher: one secret per run, for every child
    subprocess.Popen(trainer_argv, env=env); subprocess.Popen(worker_argv, env=env)

When the variable is set, every arrow_flight server checks it, loopback ones included: on a
machine shared with other users or jobs, 127.0.0.1 is reachable by all of them, and a set secret
means "only this run's processes". `jax_transfer` has no way to check a secret, so it refuses any
address but loopback (see `config.TransferConfig`).
"""
from __future__ import annotations

import hmac
import ipaddress
import os
from secrets import token_urlsafe  # the standard library's module (imports are absolute)

SECRET_ENV = "JAXPOD_TRANSFER_SECRET"
GENERATE = "python -c \"import secrets; print(secrets.token_urlsafe(32))\""
MIN_CHARS = 16


def is_loopback(host: str) -> bool:
  """Whether `host` (an IP address or "localhost") names this machine's loopback interface only."""
  host = host.strip().strip("[]")
  if host.lower() == "localhost":
    return True
  try:
    ip = ipaddress.ip_address(host)
  except ValueError:
    return False  # a host name other than localhost may resolve to a network address
  return (getattr(ip, "ipv4_mapped", None) or ip).is_loopback  # ::ffff:127.0.0.1 (a dual-stack socket)


def new_secret() -> str:
  """A fresh random secret (32 bytes, URL-safe text)."""
  return token_urlsafe(32)


def ensure_secret(env: dict[str, str] | None = None, var: str = SECRET_ENV) -> dict[str, str]:
  """A copy of `env` (default: this process's environment) whose `var` holds a secret: the one
  already there, else a new one. Pass the result to every process of the run; nothing is logged."""
  out = dict(os.environ if env is None else env)
  if not out.get(var):
    out[var] = new_secret()
  return out


def read_secret(var: str, required: bool, why: str) -> str | None:
  """The secret in environment variable `var`; None if unset and not `required`.

  Raises a one-line ValueError naming the variable (never the value) when it is required and
  unset, or set but shorter than MIN_CHARS."""
  value = os.environ.get(var, "")
  if not value:
    if required:
      raise ValueError(f"{why} needs a per-run secret in the environment variable {var}; generate one with "
                       f"`export {var}=$({GENERATE})` and give the same value to the trainer and its clients")
    return None
  if len(value) < MIN_CHARS:
    raise ValueError(f"the secret in {var} has {len(value)} characters, fewer than {MIN_CHARS}; "
                     f"generate one with `{GENERATE}`")
  return value


def matches(given: str | bytes | None, secret: str) -> bool:
  """Whether `given` equals `secret`, compared in constant time."""
  if given is None:
    return False
  if isinstance(given, str):
    given = given.encode()
  return hmac.compare_digest(given, secret.encode())
