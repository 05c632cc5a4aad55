"""`TransferConfig`: one frozen dataclass for every transport, validated before anything starts."""
from __future__ import annotations

import dataclasses
import re

from jaxpod.transfer.secrets import SECRET_ENV, is_loopback

MODES = ("checkpoint", "ray", "jax_transfer", "arrow_flight")
COORDINATORS = ("ray", "kv", "filesystem")
WIRE_DTYPES = (None, "bfloat16", "float16", "float32")


@dataclasses.dataclass(frozen=True)
class TransferConfig:
  """How a trainer publishes weights and how inference workers find and pull them."""

  mode: str = "arrow_flight"  # one of MODES
  coordinator: str | None = None  # one of COORDINATORS; None: "filesystem" for checkpoint, else "ray"
  name: str = "jaxpod_weights"  # coordinator name (Ray actor name / kv prefix); unique per run
  ray_namespace: str | None = None  # Ray namespace of the coordinator actor (None: the driver's)
  folder: str = ""  # fsspec URL (local path, gs://...) for checkpoint mode and the filesystem coordinator
  keep_n: int = 3  # versions kept alive (files, object-store refs, served tables) for clients mid-pull
  wire_dtype: str | None = None  # cast floating arrays to this dtype on the wire (e.g. "bfloat16")
  bind_address: str = "127.0.0.1"  # interface servers listen on; not loopback: arrow_flight only, with a secret
  advertise_address: str | None = None  # host clients dial; None: bind_address, or this host's name if wildcard
  secret_env: str = SECRET_ENV  # environment variable holding the run's secret (the value is never in the config)
  num_servers: int = 2  # arrow_flight: servers in the trainer process
  streams: int = 4  # arrow_flight: parallel client streams
  chunk_bytes: int = 4 << 20  # arrow_flight: bytes per record batch
  stream_bytes: int = 64 << 20  # arrow_flight: a parameter larger than this is split over streams
  publish_timeout_s: float = 60.0  # deadline of one publish (coordinator calls, writes), plus bytes / min_mb_per_s
  receive_timeout_s: float = 60.0  # deadline of one pull once a newer version is seen, plus bytes / min_mb_per_s
  background: bool = False  # PublishWeightsHook: upload in a thread while training goes on; commit at the next publish
  min_mb_per_s: float = 20.0  # slowest rate a deadline allows: a 16 GB model adds 800 s, a 10 MB one 0.5 s
  poll_interval_s: float = 0.05  # how often receive(wait=...) and the jax_transfer server poll
  coordinator_timeout_s: float = 30.0  # deadline of one coordinator call

  def __post_init__(self):
    if self.mode not in MODES:
      raise ValueError(f"transfer.mode={self.mode!r} is unknown; use one of {MODES}")
    if self.coordinator is None:
      object.__setattr__(self, "coordinator", "filesystem" if self.mode == "checkpoint" else "ray")
    if self.coordinator not in COORDINATORS:
      raise ValueError(f"transfer.coordinator={self.coordinator!r} is unknown; use one of {COORDINATORS}")
    if self.mode == "ray" and self.coordinator != "ray":
      raise ValueError(f"transfer.coordinator={self.coordinator!r} cannot hold Ray object refs; "
                       "set coordinator='ray' for mode='ray'")
    if (self.mode == "checkpoint" or self.coordinator == "filesystem") and not self.folder:
      raise ValueError("transfer.folder is empty; set it to an fsspec URL (a local path or gs://bucket/dir) "
                       f"for mode={self.mode!r} / coordinator={self.coordinator!r}")
    if not self.name or "/" in self.name:
      raise ValueError(f"transfer.name={self.name!r} must be a non-empty name without '/'")
    if self.keep_n < 1:
      raise ValueError(f"transfer.keep_n={self.keep_n} must be >= 1 (clients mid-pull need their version)")
    if self.wire_dtype not in WIRE_DTYPES:
      raise ValueError(f"transfer.wire_dtype={self.wire_dtype!r} is unknown; use one of {WIRE_DTYPES}")
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.secret_env):
      # the value is not echoed: a secret pasted here by mistake must not reach a log
      raise ValueError(f"transfer.secret_env must name an environment variable (letters, digits, _; e.g. "
                       f"{SECRET_ENV!r}) that holds the secret, never the secret itself")
    if self.mode == "jax_transfer" and not is_loopback(self.bind_address):
      raise ValueError(f"transfer.bind_address={self.bind_address!r}: mode='jax_transfer' cannot authenticate "
                       "clients, so it binds loopback only; across machines use mode='arrow_flight' (with a "
                       f"secret in {self.secret_env}) or mode='checkpoint' (a bucket)")
    if self.advertise_address is not None and self.advertise_address in ("0.0.0.0", "::", ""):
      raise ValueError(f"transfer.advertise_address={self.advertise_address!r} cannot be dialled; give this "
                       "host's name or IP (or leave it None)")
    for field in ("num_servers", "streams", "chunk_bytes", "stream_bytes"):
      if getattr(self, field) < 1:
        raise ValueError(f"transfer.{field}={getattr(self, field)} must be >= 1")
    if self.stream_bytes < self.chunk_bytes:
      raise ValueError(f"transfer.stream_bytes={self.stream_bytes} must be >= chunk_bytes={self.chunk_bytes}")
    for field in ("publish_timeout_s", "receive_timeout_s", "poll_interval_s", "coordinator_timeout_s",
                  "min_mb_per_s"):
      if getattr(self, field) <= 0:
        raise ValueError(f"transfer.{field}={getattr(self, field)} must be > 0 seconds")

  def deadline_s(self, base_s: float, nbytes: int) -> float:
    """`base_s` plus `nbytes` at `min_mb_per_s` (runtime's one rule for deadlines that scale with bytes)."""
    from jaxpod.runtime.control import bytes_timeout_s
    return bytes_timeout_s(base_s, nbytes, self.min_mb_per_s * 1e6)

  @property
  def off_host(self) -> bool:
    """Whether servers listen on an address other machines can reach (then a secret is required)."""
    return self.mode == "arrow_flight" and not is_loopback(self.bind_address)

  def dial_host(self) -> str:
    """The host name clients use to reach servers bound to `bind_address`."""
    if self.advertise_address:
      return self.advertise_address
    if self.bind_address in ("0.0.0.0", "::", "[::]"):
      import socket
      return socket.getfqdn()
    return self.bind_address
