"""jaxpod.transfer: trainer -> inference-worker weight transfer, one contract over four transports.

Modes: "checkpoint" (fsspec folder), "ray" (object store), "jax_transfer"
(jax.experimental.transfer), "arrow_flight" (pyarrow.flight). See `api` for the contract and
the older-id rule, `coordinators` for how versions are registered.
"""
from jaxpod.transfer.api import (TransferError, WeightClient, WeightServer, WeightUpdate, create_client,
                                 create_server)
from jaxpod.transfer.config import MODES, TransferConfig
from jaxpod.transfer.coordinators import get_or_create_actor
from jaxpod.transfer.flatten import abstract
from jaxpod.transfer.hooks import PublishWeightsHook
from jaxpod.transfer.metrics import TransferMetrics
