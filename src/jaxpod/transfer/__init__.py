"""jaxpod.transfer: trainer -> inference-worker weight transfer, one contract over four transports.

Modes: "checkpoint" (fsspec folder), "ray" (object store), "jax_transfer"
(jax.experimental.transfer), "arrow_flight" (pyarrow.flight). See `api` for the contract and
the older-id rule, `coordinators` for how versions are registered. Names are imported lazily
so that `jaxpod.transfer.coordinators` and `config` load without JAX.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "TransferConfig": "config", "MODES": "config",
    "create_server": "api", "create_client": "api", "WeightUpdate": "api", "WeightServer": "api",
    "WeightClient": "api", "TransferError": "api", "TransferAuthError": "api",
    "ensure_secret": "secrets", "SECRET_ENV": "secrets",
    "get_or_create_actor": "coordinators",
    "abstract": "flatten",
    "PublishWeightsHook": "hooks",
    "TransferMetrics": "metrics",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
  if name not in _EXPORTS:
    raise AttributeError(f"module 'jaxpod.transfer' has no attribute {name!r}")
  return getattr(importlib.import_module(f"jaxpod.transfer.{_EXPORTS[name]}"), name)
