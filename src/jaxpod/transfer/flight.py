"""Mode "arrow_flight": pyarrow.flight servers in the trainer, parallel chunked streams to clients.

The trainer runs `num_servers` Flight servers (bound to `bind_address`, 127.0.0.1 unless
configured) sharing one table of versions: seq -> pieces as raw bytes. A ticket is JSON
(seq, piece, byte range); a parameter larger than `stream_bytes` is split over several
tickets so one big array uses several streams, and each stream sends `chunk_bytes` record
batches of one uint8 column. The coordinator holds (weight id, parameter table, addresses).
Clients fetch with `streams` threads spread over the servers and copy each chunk into its
place; nothing is unpickled: tickets are JSON and data are Arrow buffers.

Authentication (see `secrets`): when the run's secret is set (required for a bind address other
than loopback), every server call must carry it in the `jaxpod-transfer-secret` header, checked
in constant time by server middleware before the call runs; a client without it or with another
one raises `api.TransferAuthError` from receive (a setup error, not a transient failure). The
secret authenticates; it does not encrypt: across an untrusted network also use a private network.
"""
from __future__ import annotations

import concurrent.futures
import json
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.flight as fl

from jaxpod.transfer import api, flatten, secrets
from jaxpod.transfer.metrics import TransferMetrics

_SCHEMA = pa.schema([("b", pa.uint8())])
_HEADER = "jaxpod-transfer-secret"


class _SecretCheck(fl.ServerMiddlewareFactory):
  """Rejects every call whose secret header is missing or differs from the run's secret."""

  def __init__(self, secret: str, var: str):
    super().__init__()
    self._secret, self.var = secret, var

  def start_call(self, info, headers):
    given = headers.get(_HEADER) or [None]
    if not secrets.matches(given[0], self._secret):
      raise fl.FlightUnauthenticatedError(f"jaxpod transfer: this call lacks the run's secret ({self.var})")
    return None


def _secret(config, side: str) -> str | None:
  """The run's secret for this server or client: required when the servers are off-host."""
  return secrets.read_secret(config.secret_env, config.off_host,
                             f"transfer.bind_address={config.bind_address!r} (arrow_flight {side}, reachable "
                             "from other machines)")


class _FlightServer(fl.FlightServerBase):
  """Serves byte ranges of the pieces of kept versions, in chunks."""

  def __init__(self, location: str, versions: dict, chunk_bytes: int, middleware: dict):
    super().__init__(location, middleware=middleware)
    self.versions, self.chunk_bytes = versions, chunk_bytes

  def do_get(self, context, ticket):
    req = json.loads(ticket.ticket.decode())
    pieces = self.versions.get(req["seq"])
    if pieces is None:
      raise fl.FlightServerError(f"version seq={req['seq']} is not served (pruned or from another trainer)")
    block = pieces[req["piece"]][tuple(slice(a, b) for a, b in req["block"])]
    data = np.ascontiguousarray(block).reshape(-1).view(np.uint8)  # a view unless the block is strided
    return fl.GeneratorStream(_SCHEMA, self.batches(data, req["start"], req["end"]))

  def batches(self, data: np.ndarray, start: int, end: int):
    """Record batches of `chunk_bytes` over data[start:end], each a view (no copy)."""
    for off in range(start, end, self.chunk_bytes):
      n = min(self.chunk_bytes, end - off)
      col = pa.Array.from_buffers(pa.uint8(), n, [None, pa.py_buffer(data[off:off + n])])
      yield pa.RecordBatch.from_arrays([col], schema=_SCHEMA)


def tickets(seq: int, i: int, meta: dict, block, itemsize: int, stream_bytes: int):
  """(ticket, byte offset in the block's buffer, nbytes) per stream for one block of one piece.

  A contiguous block is split into byte ranges of `stream_bytes`; a strided one into groups of
  rows along its first dimension (the server copies each group once), so no stream is larger
  than needed and a big block still uses several streams."""
  shape = [b - a for a, b in meta["index"]]
  nbytes = int(np.prod([b - a for a, b in block], dtype=np.int64)) * itemsize
  if flatten.contiguous(block, shape) or not block:
    for start in range(0, max(nbytes, 1), stream_bytes):
      end = min(nbytes, start + stream_bytes)
      yield {"seq": seq, "piece": i, "block": block, "start": start, "end": end}, start, end - start
    return
  (a0, b0), rest = block[0], block[1:]
  row = nbytes // (b0 - a0)
  step = max(1, stream_bytes // max(row, 1))
  for r in range(a0, b0, step):
    sub = [[r, min(b0, r + step)], *[list(x) for x in rest]]
    n = (sub[0][1] - r) * row
    yield {"seq": seq, "piece": i, "block": sub, "start": 0, "end": n}, (r - a0) * row, n


class Server(api.ServerBase):
  """Keeps the last keep_n versions in memory and serves them from several Flight servers."""

  keeps_pieces = True

  def __init__(self, config, coordinator=None):
    secret = _secret(config, "server")  # before anything starts
    super().__init__(config, coordinator)
    self.versions: dict[int, list[np.ndarray]] = {}  # seq -> pieces (wire dtype, piece shape)
    middleware = {"secret": _SecretCheck(secret, config.secret_env)} if secret else {}
    self.servers = [_FlightServer(f"grpc://{config.bind_address}:0", self.versions, config.chunk_bytes, middleware)
                    for _ in range(config.num_servers)]
    self.addresses = [f"grpc://{config.dial_host()}:{s.port}" for s in self.servers]

  def _stage(self, seq: int, table: dict, pieces: list[flatten.Piece], m: TransferMetrics) -> dict:
    with m.phase("serve"):
      self.versions[seq] = [p.data for p in pieces]  # served in place: no copy here
    return {"addresses": self.addresses}

  def _retire(self, seqs: list[int]) -> None:
    for seq in seqs:
      self.versions.pop(seq, None)

  def _close(self) -> None:
    for s in self.servers:
      s.shutdown()
    self.versions.clear()


class Client(api.ClientBase):
  """Fetches every byte range in parallel threads, each copying chunks into the piece buffer."""

  def __init__(self, config, coordinator=None):
    secret = _secret(config, "client")
    super().__init__(config, coordinator)
    self.headers = [(_HEADER.encode(), secret.encode())] if secret else []
    self.local = threading.local()
    self.pool = concurrent.futures.ThreadPoolExecutor(config.streams, thread_name_prefix="flight-fetch")

  def _conn(self, address: str) -> fl.FlightClient:
    conns = self.local.__dict__.setdefault("conns", {})
    if address not in conns:
      conns[address] = fl.FlightClient(address)
    return conns[address]

  def _get(self, address: str, ticket: dict, dst: np.ndarray, deadline: float) -> None:
    try:
      self._stream(address, ticket, dst, deadline)
    except Exception:
      self.local.__dict__.get("conns", {}).pop(address, None)  # a dead trainer's address: reconnect later
      raise

  def _stream(self, address: str, ticket: dict, dst: np.ndarray, deadline: float) -> None:
    options = fl.FlightCallOptions(timeout=max(0.1, deadline - time.monotonic()), headers=self.headers)
    reader = self._conn(address).do_get(fl.Ticket(json.dumps(ticket).encode()), options)
    off, end = 0, ticket["end"] - ticket["start"]
    for chunk in reader:
      buf = chunk.data.column(0).buffers()[1]
      n = chunk.data.num_rows
      dst[off:off + n] = np.frombuffer(buf, np.uint8, count=n, offset=chunk.data.column(0).offset)
      off += n
    if off != end:
      raise api.TransferError(f"stream for piece {ticket['piece']} ended at byte {off} of {end}")

  def _fetch(self, record: dict, asm: flatten.Assembler, m: TransferMetrics, deadline: float) -> None:
    jobs, buffers, marks = [], [], []
    for part in record["meta"]["parts"]:
      addresses = part["addresses"]
      for i, meta in enumerate(part["pieces"]):
        itemsize = meta["nbytes"] // max(1, int(np.prod([b - a for a, b in meta["index"]], dtype=np.int64)))
        for block in asm.blocks(meta):
          dst = asm.target(meta, block)  # straight into the parameter's buffer when contiguous there
          if dst is None:
            dst = flatten.aligned_empty(asm.block_bytes(meta, block))
            buffers.append((meta, block, dst))
          else:
            marks.append((meta, block))
          block = [list(x) for x in block]
          for ticket, off, n in tickets(record["seq"], i, meta, block, itemsize, self.config.stream_bytes):
            jobs.append((addresses[len(jobs) % len(addresses)], ticket, dst[off:off + n]))
    with m.phase("fetch"):
      futures = [self.pool.submit(self._get, a, t, d, deadline) for a, t, d in jobs]
      try:
        for f in futures:
          f.result(timeout=max(0.1, deadline - time.monotonic()))
      except fl.FlightUnauthenticatedError:
        for f in futures:
          f.cancel()
        have = (f"this client's {self.config.secret_env} differs from the trainer's" if self.headers else
                f"this client has no secret: set {self.config.secret_env} to the trainer's in its environment")
        raise api.TransferAuthError(f"arrow_flight: the trainer's servers refused version seq={record['seq']}: "
                                    f"{have}") from None
      except (fl.FlightError, pa.ArrowException, OSError, concurrent.futures.TimeoutError) as e:
        for f in futures:
          f.cancel()
        raise api.TransferError(f"version seq={record['seq']}: {type(e).__name__}: {e}") from None
    with m.phase("decode"):
      for meta, block, dst in buffers:
        asm.put_block_bytes(meta, block, dst)
      for meta, block in marks:
        asm.mark(meta, block)

  def _close(self) -> None:
    self.pool.shutdown(wait=False, cancel_futures=True)
