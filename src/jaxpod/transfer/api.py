"""The weight-transfer contract shared by every transport: `create_server`, `create_client`.

    with create_server(cfg) as server:           # trainer: every host calls publish
      server.publish(step, params)
    with create_client(cfg) as client:           # inference worker
      update = client.receive(like, wait=5.0)    # WeightUpdate(params, weight_id) | None

`like` is a pytree of `jax.ShapeDtypeStruct`s carrying the client's own shardings; the
client may use another mesh than the trainer (and another floating dtype: values are cast).
`None` means "nothing newer than what you hold", or a newer version could not be fetched
before `receive_timeout_s` (its trainer died, it was pruned): the failure is counted in
`client.metrics()` and the next call retries. `wait` bounds the polling for a newer version;
each fetch attempt is bounded separately by `receive_timeout_s`. Coordinator errors raise, and so
does `TransferAuthError` (the trainer's servers refused this client's secret: see `secrets`).

The version record the coordinator holds per publication says which trainer host serves which
slice of which array: {seq, weight_id, epoch, meta: {table: name -> {shape, dtype, wire},
parts: [{host, pieces: [{name, index: [[start, stop] per dim], nbytes}], + the transport's
addresses / file / refs}]}}. Every trainer host stages only its own replica-0 shards; only this
metadata goes through the leader. A client fetches the blocks its own devices need from it.

The older-id rule: the newest *publication* wins, not the largest weight id. Each publish
gets a sequence number from the coordinator, strictly larger than every earlier one, and a
client rolls to any version whose (coordinator epoch, seq) it has not seen yet, even when
its weight id is lower than the one it holds. Why: in RL post-training a trainer that
publishes a lower id has been restored from an older checkpoint after a crash or a
divergence; from then on every gradient step is taken from the restored policy, so rollouts
from the abandoned "newer" weights are off-policy data for a trajectory that no longer
exists. Ignoring lower ids would keep workers on dead weights until the trainer's step count
caught up (possibly thousands of steps). The weight id is a label the client reports
(`update.weight_id`) so logs show the rollback; `update.seq` orders publications.
"""
from __future__ import annotations

import dataclasses
import importlib
import logging
import time
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from jaxpod.transfer import coordinators, flatten, spread
from jaxpod.transfer.config import TransferConfig
from jaxpod.transfer.metrics import Totals, TransferMetrics
from jaxpod.transfer.pending import PendingPublish

log = logging.getLogger("jaxpod.transfer")


class TransferError(RuntimeError):
  """A version could not be fetched (its source died, it was pruned, or a deadline passed)."""


class TransferAuthError(RuntimeError):
  """The trainer's servers refused this client's secret (a setup error: receive raises it, never retries)."""


@dataclasses.dataclass
class WeightUpdate:
  """A received version: the params on the client's shardings and the trainer's weight id."""

  params: Any
  weight_id: int
  seq: int = 0  # publication number on the coordinator (orders versions; see the older-id rule)
  metrics: TransferMetrics | None = None
  epoch: str = ""  # coordinator epoch the version was published in


class WeightServer(Protocol):
  def publish(self, weight_id: int, params: Any) -> TransferMetrics: ...
  def metrics(self) -> dict: ...
  def close(self) -> None: ...


class WeightClient(Protocol):
  def receive(self, like: Any, wait: float | None = None) -> WeightUpdate | None: ...
  def metrics(self) -> dict: ...
  def close(self) -> None: ...


def trainer_processes(params: Any) -> set[int]:
  """JAX process indices holding any shard of `params` (arrays or ShapeDtypeStructs with shardings;
  one process unless a mesh spans hosts)."""
  procs = set()
  for leaf in jax.tree_util.tree_leaves(params):
    sharding = getattr(leaf, "sharding", None)
    if isinstance(sharding, jax.sharding.Sharding) and not sharding.is_fully_addressable:
      procs.update(d.process_index for d in sharding.device_set)
  return procs or {jax.process_index()}


def table_bytes(table: dict) -> int:
  """Bytes of a whole version on the wire, from its parameter table (the same on every host)."""
  return sum(int(np.prod(info["shape"], dtype=np.int64)) * np.dtype(jnp.dtype(info["wire"])).itemsize
             for info in table.values())


class _Endpoint:
  """What servers and clients share: metrics totals, an idempotent close, a context manager.

  Servers stop serving on close (versions already committed stay readable only where the
  transport allows); clients drop their connections (a later receive raises).
  """

  def metrics(self) -> dict:
    """Totals and the last transfer's per-phase figures."""
    return self.totals.as_dict()

  def close(self) -> None:
    if not self.closed:
      self.closed = True
      self._close()
      self.coord.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


class ServerBase(_Endpoint):
  """Publish = flatten (replica 0) -> reserve seq -> transport stages -> leader commits -> every host returns."""

  keeps_pieces = False  # True: the transport serves the pieces after publish returns (see flatten._host)

  def __init__(self, config: TransferConfig, coordinator: coordinators.Coordinator | None = None):
    self.config = config
    self.coord = coordinator or coordinators.create_coordinator(config)
    self.epoch = self.coord.epoch()
    self.totals = Totals()
    self.closed = False
    self.staged: list[int] = []  # seqs this host staged and still keeps (the last keep_n)
    self.leader = True  # this host commits (False on the other hosts of a multi-host trainer)

  def _stage(self, seq: int, table: dict, pieces: list[flatten.Piece], m: TransferMetrics) -> dict:
    raise NotImplementedError

  def _retire(self, seqs: list[int]) -> None:
    """Free what the transport holds for versions older than the last keep_n (every host)."""

  def _close(self) -> None:
    """Stop the transport's servers."""

  def publish(self, weight_id: int, params: Any) -> TransferMetrics:
    """Publish `params` as `weight_id`; every host of a multi-host trainer calls this."""
    return self.publish_in_background(weight_id, params, snapshot=False, thread=False).result()

  def publish_in_background(self, weight_id: int, params: Any, snapshot: bool = True,
                            thread: bool = True) -> PendingPublish:
    """Start publishing `params` as `weight_id` and return at once; `.result()` commits it.

    The upload (device -> host copies and the transport's writes, the part that grows with the
    model) runs in a thread while the caller goes on (the trainer's next step); the coordination
    (the version number now, the commit in `.result()`) stays on the calling thread, so control-plane
    calls keep one order on every host. With `snapshot`, `params` are first copied on device, so a
    train step that donates them cannot change what is being sent. Every host calls this and then
    `.result()` at the same point of its program."""
    if self.closed:
      raise RuntimeError("publish() on a closed weight server")
    m = TransferMetrics("server", int(weight_id))
    try:
      multi = self._check_hosts(params)
      self.leader = not multi or jax.process_index() == 0
      if snapshot:
        params = jax.tree_util.tree_map(lambda x: x.copy() if isinstance(x, jax.Array) else x, params)
      with m.phase("register"):
        m.seq = self._reserve(multi)
    except Exception:
      self.totals.record(m, ok=False)
      raise
    return PendingPublish(self, m, params, multi, thread)

  def _upload(self, m: TransferMetrics, params: Any) -> tuple[dict, dict]:
    """(parameter table, this host's part of the version record): flatten and stage; no control plane."""
    with m.phase("flatten"):
      table, pieces = flatten.to_pieces(params, self.config.wire_dtype, leader=self.leader,
                                        own=self.keeps_pieces)
    m.nbytes = flatten.total_bytes(pieces)
    m.num_params = len(table)
    m.largest_param_bytes = max((p.data.nbytes for p in pieces), default=0)
    part = self._stage(m.seq, table, pieces, m)  # records its own phases
    return table, {"host": jax.process_index(), "pieces": [p.meta() for p in pieces], **part}

  def _finish(self, m: TransferMetrics, table: dict, part: dict, multi: bool) -> TransferMetrics:
    """Commit an uploaded version (every host returns once it is committed) and retire old ones."""
    with m.phase("register"):
      self._commit(m.seq, m.weight_id, table, part, multi)
    self.staged.append(m.seq)
    old, self.staged = self.staged[:-self.config.keep_n], self.staged[-self.config.keep_n:]
    if old:
      self._retire(old)
    self.totals.record(m, ok=True)
    log.info("published weight_id=%d seq=%d: %.1f MB in %.3fs", m.weight_id, m.seq, m.nbytes / 1e6, m.seconds)
    return m

  def _check_hosts(self, params: Any) -> bool:
    """True for a multi-host trainer, which must be the whole jax.distributed job."""
    procs = trainer_processes(params)
    if len(procs) == 1:
      return False
    if procs != set(range(jax.process_count())):
      raise ValueError(f"params span JAX processes {sorted(procs)} of {jax.process_count()}: a multi-host "
                       "trainer must be its own jax.distributed job (run inference workers as another job)")
    return True

  def _reserve(self, multi: bool) -> int:
    """The version number; on a multi-host trainer the leader reserves it and broadcasts it."""
    if not multi:
      return self.coord.reserve()
    from jaxpod import runtime
    return int(runtime.broadcast_call(self.coord.reserve, f"transfer/{self.config.name}/reserve",
                                      timeout_s=self.config.publish_timeout_s))

  def _commit(self, seq: int, weight_id: int, table: dict, part: dict, multi: bool) -> None:
    """The leader commits the version record with every host's part; every host returns only once
    it is committed (invariant 9), and a failed commit raises on every host (PeerFailed on the others).

    The parts travel through the coordinator's store (Ray refs travel too); the commit is one
    broadcast, time-limited by publish_timeout_s, whose value every other host waits for."""
    def commit(parts: list[dict]) -> int:
      self.epoch = self.coord.epoch()  # re-read: a restarted coordinator actor starts a new epoch
      self.coord.commit(seq, weight_id, self.epoch, {"table": table, "parts": parts})
      return seq
    if not multi:
      commit([part])
      return
    from jaxpod import runtime
    # the slowest host's upload ends the barrier: its deadline grows with the model, not fixed
    name, timeout_s = f"transfer/{self.config.name}", self.config.deadline_s(self.config.publish_timeout_s,
                                                                             table_bytes(table))
    self.coord.store.put(f"part/{seq}/{jax.process_index()}", part)
    runtime.barrier(f"{name}/parts", timeout_s=timeout_s)
    runtime.broadcast_call(lambda: commit(self._collect_parts(seq)), f"{name}/commit", timeout_s=timeout_s)

  def _collect_parts(self, seq: int) -> list[dict]:
    """Every host's part of version `seq`, read (and removed) from the coordinator's store by the leader."""
    found = self.coord.store.items(f"part/{seq}/")
    for key, _ in found:
      self.coord.store.delete(key)
    return [v for _, v in found]


class ClientBase(_Endpoint):
  """Receive = look up the newest version -> fetch its pieces -> place them on `like`'s shardings."""

  def __init__(self, config: TransferConfig, coordinator: coordinators.Coordinator | None = None):
    self.config = config
    self.coord = coordinator or coordinators.create_coordinator(config)
    self.held: tuple[str, int] | None = None  # (epoch, seq) of the version we hold
    self.totals = Totals()
    self.closed = False

  def _fetch(self, record: dict, asm: flatten.Assembler, m: TransferMetrics, deadline: float) -> None:
    raise NotImplementedError

  def _close(self) -> None:
    """Release the transport's connections."""

  def is_newer(self, record: dict) -> bool:
    """The older-id rule: any publication not yet held is newer, whatever its weight id."""
    if self.held is None:
      return True
    epoch, seq = self.held
    return record["epoch"] != epoch or record["seq"] > seq

  def receive(self, like: Any, wait: float | None = None) -> WeightUpdate | None:
    """The newest version if newer than the one held, else None; `wait` polls up to that many seconds.

    A multi-host client (`like` spans processes, its own jax.distributed job) calls this on every
    host: the leader picks the version, every host fetches only its own devices' slices, and the
    update is taken only if every host got its part (else None everywhere)."""
    if self.closed:
      raise RuntimeError("receive() on a closed weight client")
    if len(trainer_processes(like)) > 1:
      return self._receive_together(like, wait)
    give_up = time.monotonic() + (wait or 0.0)
    while True:
      record = self.coord.latest()
      if record is not None and self.is_newer(record):
        update = self._try_fetch(record, like)
        self._record(update)
        if update is not None:
          self.held = (record["epoch"], record["seq"])
          return update
      if wait is None or time.monotonic() >= give_up:
        return None
      time.sleep(self.config.poll_interval_s)

  def _poll(self, wait: float | None) -> dict | None:
    """The newest record not yet held, polling up to `wait` seconds; None if there is none."""
    give_up = time.monotonic() + (wait or 0.0)
    while True:
      record = self.coord.latest()
      if record is not None and self.is_newer(record):
        return record
      if wait is None or time.monotonic() >= give_up:
        return None
      time.sleep(self.config.poll_interval_s)

  def _receive_together(self, like: Any, wait: float | None) -> WeightUpdate | None:
    from jaxpod import runtime
    procs = trainer_processes(like)
    if procs != set(range(jax.process_count())):
      raise ValueError(f"`like` spans JAX processes {sorted(procs)} of {jax.process_count()}: a multi-host "
                       "client must be its own jax.distributed job")
    name = f"transfer/{self.config.name}/receive"
    slack = self.config.coordinator_timeout_s + 30.0
    give_up = time.monotonic() + (wait or 0.0)  # read on the leader only
    rounds = 0
    while True:  # like the one-host loop: retry a failed version until `wait` runs out
      def pick(first=rounds == 0):
        left = give_up - time.monotonic()
        if not first and left <= 0:
          return None
        record = self._poll(None if wait is None else max(0.0, left))
        return None if record is None else [record["epoch"], record["seq"]]
      picked = runtime.broadcast_call(pick, f"{name}/pick", timeout_s=(wait or 0.0) + slack)
      if picked is None:
        return None
      rounds += 1
      fetch_like, spread_out = spread.fetch_layout(like)  # each region fetched once across the hosts
      update, nbytes = self._fetch_part(picked, fetch_like)
      oks = runtime.allgather(update is not None, f"{name}/ok",
                              timeout_s=self.config.deadline_s(self.config.receive_timeout_s, nbytes) + slack)
      if all(oks):
        if spread_out:  # a collective: only once every host holds its blocks
          update.params = jax.block_until_ready(spread.place(update.params, like))
        self._record(update)
        self.held = (update.epoch, update.seq)
        return update
      if update is not None:
        log.warning("seq=%d: host(s) %s failed their part; dropping the update", picked[1],
                    [i for i, ok in enumerate(oks) if not ok])
      self._record(None, update.metrics if update else None)
      if wait is None:
        return None

  def _fetch_part(self, picked: list, like: Any) -> tuple[WeightUpdate | None, int]:
    """This host's slices of the version the leader picked ([epoch, seq]) or None, and the version's
    bytes (what the other hosts' deadlines scale with)."""
    record = self.coord.get(picked[1])
    if record is None or record["epoch"] != picked[0]:
      log.warning("version seq=%d was pruned before this host read it", picked[1])
      return None, 0
    return self._try_fetch(record, like), table_bytes(record["meta"]["table"])

  def _record(self, update: WeightUpdate | None, failed: TransferMetrics | None = None) -> None:
    if update is None:
      self.totals.record(failed, ok=False)
    else:
      self.totals.record(update.metrics, ok=True)

  granularity = "block"  # what _fetch moves: "block" (only needed slices), "piece", or "all"

  def _try_fetch(self, record: dict, like: Any) -> WeightUpdate | None:
    m = TransferMetrics("client", record["weight_id"])
    try:
      asm = flatten.Assembler(record["meta"]["table"], like)
      pieces = [p for part in record["meta"]["parts"] for p in part["pieces"]]
      if self.granularity == "block":
        m.nbytes = sum(asm.wanted_bytes(p) for p in pieces)
      else:
        m.nbytes = sum(p["nbytes"] for p in pieces if self.granularity == "all" or asm.blocks(p))
      deadline = time.monotonic() + self.config.deadline_s(self.config.receive_timeout_s, m.nbytes)
      m.num_params = len(record["meta"]["table"])
      m.largest_param_bytes = max((p["nbytes"] for p in pieces), default=0)
      self._fetch(record, asm, m, deadline)
      with m.phase("place"):
        params = jax.block_until_ready(asm.finish())
    except TransferError as e:
      log.warning("weight_id=%d seq=%d not received: %s", record["weight_id"], record["seq"], e)
      return None
    return WeightUpdate(params, int(record["weight_id"]), int(record["seq"]), m, record["epoch"])


_MODULES = {"checkpoint": "checkpoint", "ray": "ray_store", "jax_transfer": "jax_transfer",
            "arrow_flight": "flight"}


def _module(config: TransferConfig):
  return importlib.import_module(f"jaxpod.transfer.{_MODULES[config.mode]}")


def create_server(config: TransferConfig, coordinator: coordinators.Coordinator | None = None) -> ServerBase:
  """The trainer side of `config.mode`, registered with its coordinator (by default `config.coordinator`'s)."""
  return _module(config).Server(config, coordinator)


def create_client(config: TransferConfig, coordinator: coordinators.Coordinator | None = None) -> ClientBase:
  """The worker side of `config.mode`."""
  return _module(config).Client(config, coordinator)
