"""A rollout worker (`jaxpod rl --topology disaggregated --role rollout`): its own JAX job of any size.

    wait for the first published version (fail after rollout.wait_for_weights_s, naming the trainer)
    loop, every host making the same calls (global mode; the leader decides and broadcasts a plan):
      - poll for a newer version (every POLL_S): inflight: swap it in between decode steps, sequences
        in flight go on with it and their later tokens carry its number; drain: stop admitting,
        finish what runs, then swap;
      - admit problems of its own stream while its unconsumed files are under rollout.max_queued_files;
      - one engine round; finished groups go to the queue, `groups_per_file` per file (the leader writes);
    until the trainer's progress record says done.

A multi-turn problem set (the calculator) runs its environments here, with the colocated topology's
episode loop (`Roller.run`, `rollout.episodes`): a round is the whole episodes of the problems
admitted (their turns interleaved on the engine), so a newer version is swapped in between rounds; each token
keeps its version and whether the policy sampled it, and the trainer's admission rule and loss mask
read them from the file as in the colocated topology.

The worker's leader writes a heartbeat every `rollout.heartbeat_s` from a background thread (so a
long compile does not look like a death): incarnation, version, files written, tokens, seconds
spent rolling out, fetching and waiting. A restarted worker continues its file numbering and
picks up the newest version.
"""
from __future__ import annotations

import os
import threading
import time
import uuid

from jaxpod import runtime
from jaxpod.policy.spec import PolicySpec
from jaxpod.problems.rewards import VerifiedProblems
from jaxpod.rl.config import RolloutConfig
from jaxpod.rl.disaggregated.queue import Queue, to_bytes
from jaxpod.runtime import progress
from jaxpod.runtime.log import get_logger
from jaxpod.runtime.mesh import MeshConfig
from jaxpod.transfer.config import TransferConfig

log = get_logger("rl.worker")
POLL_S = 0.2  # how often the leader looks for a newer version
STREAM_BASE = 100  # worker w samples problems of training stream STREAM_BASE + w


class Heartbeat:
  """The leader's background heartbeat: the latest `stats` every `every_s` seconds."""

  def __init__(self, queue: Queue, worker: int, every_s: float, stats: dict):
    self.queue, self.worker, self.every_s, self.stats = queue, worker, every_s, stats
    self.beat = 0
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, name="rl-heartbeat", daemon=True)
    self._thread.start()

  def _run(self) -> None:
    while not self._stop.is_set():
      self.beat += 1
      try:
        self.queue.beat(self.worker, {**self.stats, "beat": self.beat})
      except Exception as e:  # noqa: BLE001 - a missed beat is not fatal; a lasting outage shows as "lost"
        log.warning("heartbeat not written: %s", e)
      self._stop.wait(self.every_s)

  def close(self) -> None:
    self._stop.set()
    self._thread.join(timeout=10)
    self.queue.beat(self.worker, {**self.stats, "beat": self.beat + 1, "stopped": True})


def _like(llama, mesh):
  """ShapeDtypeStructs of the policy's params with this worker's shardings (what `receive` fills)."""
  import jax
  from flax import nnx
  from jaxpod.models.llama import abstract
  from jaxpod.runtime.sharding import state_shardings
  graphdef, params = nnx.split(abstract(llama))
  leaves, treedef = jax.tree.flatten(params)
  shardings = jax.tree.leaves(state_shardings(params, mesh))  # one per parameter, in the same order
  return graphdef, jax.tree.unflatten(treedef, [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s)
                                                for a, s in zip(leaves, shardings)])


def _first_weights(client, like, transfer: TransferConfig, w: int, wait: float, run_dir: str):
  """The newest version, polling up to `wait` (rollout.wait_for_weights_s); a one-line error naming the trainer."""
  from jaxpod.rl.disaggregated.publish import describe
  update = client.receive(like, wait=wait)
  if update is None:
    raise runtime.Unavailable(f"rollout worker {w}: no policy weights published within {wait:.0f} s ({describe(transfer)});"
                       f" the trainer of run {run_dir} (jaxpod rl --topology disaggregated --role trainer, same "
                       "config) is not running or still in its warm-up; start it, or raise rollout.wait_for_weights_s")
  return update


def run_worker(policy: PolicySpec, problems: VerifiedProblems, rollout: RolloutConfig, *, num_generations: int,
               mesh: MeshConfig, transfer: TransferConfig, run_dir: str) -> None:
  """The worker loop (see the module docstring); every host of the worker job calls it. `transfer`: resolved."""
  from jaxpod.policy.engine import make_sampler
  from jaxpod.policy.rollout.episodes import samples_for
  from jaxpod.policy.rollout.roller import Roller
  from jaxpod.policy.spec import check_same_problems
  from jaxpod.runtime import mesh_from_config
  check_same_problems(problems.problem_set, f"rollout-worker-{rollout.worker_id}")
  from jaxpod.transfer.api import create_client
  r, w = rollout, rollout.worker_id
  device_mesh = mesh_from_config(mesh)
  tokenizer, llama, stop_ids = policy.tokenizer, policy.llama, policy.stop_ids
  graphdef, like = _like(llama, device_mesh)
  client = create_client(transfer)
  if policy.lora is not None:  # adapters only on the wire; the base loaded once (rl/adapters.py)
    from jaxpod.rl.adapters import worker_side
    graphdef, like, client = worker_side(policy, llama, device_mesh, client)
  queue = Queue(run_dir)
  stats = {"worker": w, "incarnation": runtime.broadcast_call(lambda: uuid.uuid4().hex[:8], "rl.worker.id"),
           "hosts": runtime.host_info().process_count, "pid": os.getpid(), "update": r.update, "version": None,
           "produced": 0, "tokens": 0, "rollout_s": 0.0, "fetch_s": 0.0, "fetches": 0, "waiting_s": 0.0}
  beat = Heartbeat(queue, w, r.heartbeat_s, stats) if runtime.is_leader() else None
  try:
    t0 = time.perf_counter()
    update = _first_weights(client, like, transfer, w, r.wait_for_weights_s, run_dir)
    stats.update(version=update.weight_id, waited_first_s=time.perf_counter() - t0)  # not a fetch: waiting
    log.info("rollout worker %d: received policy version %d", w, update.weight_id)
    sampler = make_sampler(graphdef, update.params, device_mesh, r, stop_ids, version=update.weight_id)
    roller = Roller(sampler, tokenizer, problems.scorer(), num_generations, problems.seed,
                    samples_for(problems, r.max_prompt_len, r.keep_kv))  # one turn, or a multi-turn set's episodes
    _loop(problems, r, num_generations, queue, client, like, sampler, roller, stats)
  finally:
    if beat is not None:
      beat.close()
    client.close()


def _round(roller, sampler, admitted: list, stats: dict) -> list | None:
  """One round of sampling: the groups it completed, or None when there was nothing to sample (it waited).
  One-turn samples stream through the engine (one decode step); a multi-turn set's round is the whole episodes
  of the problems admitted (`Roller.run`)."""
  if roller.continuous and admitted:
    roller.submit(admitted)
  busy = not sampler.idle if roller.continuous else bool(admitted)
  if not busy:
    t = time.perf_counter()
    time.sleep(0.02)
    stats["waiting_s"] += time.perf_counter() - t
    return None
  t = time.perf_counter()
  before = roller.tokens
  groups = roller.collect(sampler.step()) if roller.continuous else roller.run(admitted)
  if "compile_s" not in stats:  # the first rounds compile the engine: kept out of the rollout rate
    stats["compile_s"] = time.perf_counter() - t
  else:
    stats["rollout_s"] += time.perf_counter() - t
    stats["tokens"] += roller.tokens - before
  return groups


def _loop(problems: VerifiedProblems, r: RolloutConfig, num_generations: int, queue: Queue, client, like, sampler, roller,
          stats: dict) -> None:
  w = r.worker_id
  seq = int(runtime.broadcast_call(lambda: queue.next_seq(w), "rl.worker.seq"))
  next_problem = seq * r.groups_per_file
  finished: list = []
  pending = None  # drain mode: the update waiting for the engine to empty
  state = {"last_poll": 0.0, "progress": None, "progress_t": 0.0}
  room = max(1, r.batch_size // num_generations)  # groups the engine can decode at once

  def plan() -> dict:  # leader only: what every host does this round
    now = time.monotonic()
    if now - state["progress_t"] > POLL_S:
      state["progress"], state["progress_t"] = queue.progress() or {}, now
    prog = state["progress"]
    taken = int(prog.get("taken_files", {}).get(str(w), 0))
    backlog = seq - taken
    open_now = roller.open_groups + len(finished)
    budget = (r.max_queued_files - backlog) * r.groups_per_file - open_now
    poll = now - state["last_poll"] >= POLL_S
    if poll:
      state["last_poll"] = now
    want = room + 1 - roller.open_groups if roller.continuous else room  # +1: the engine never runs dry
    return {"done": bool(prog.get("done")), "stopped": bool(prog.get("stopped")), "poll": poll,
            "admit": max(0, min(want, budget)) if pending is None else 0}

  last_log = time.monotonic()
  while True:
    progress.mark(f"rl rollout worker {w} round")  # polling a full queue is progress too (the watchdog)
    p = runtime.broadcast_call(plan, "rl.worker.plan")
    if p["done"]:
      log.info("rollout worker %d: the trainer %s; %d files written", w,
               "stopped without finishing (its log says why)" if p["stopped"] else "is done", seq)
      return
    if p["poll"]:
      t = time.perf_counter()
      update = client.receive(like)
      if update is not None:
        stats["fetch_s"] += time.perf_counter() - t
        stats["fetches"] += 1
        if r.update == "inflight":
          sampler.update_params(update.params, update.weight_id)
          stats["version"] = update.weight_id
        else:
          pending = update
    if pending is not None and sampler.idle:
      sampler.update_params(pending.params, pending.weight_id)
      stats["version"], pending = pending.weight_id, None
    admitted = problems.train_problems(STREAM_BASE + w, next_problem, p["admit"]) if p["admit"] else []
    next_problem += p["admit"]
    groups = _round(roller, sampler, admitted, stats)
    if groups is None:
      continue
    finished += groups
    while len(finished) >= r.groups_per_file:
      batch, finished = finished[:r.groups_per_file], finished[r.groups_per_file:]
      if runtime.is_leader():
        versions = [min(g.oldest_version() for g in batch), max(g.newest_version() for g in batch)]
        queue.put(w, seq, to_bytes(batch, {"worker": w, "seq": seq, "incarnation": stats["incarnation"],
                                           "versions": versions, "created": time.time()}))
      seq += 1
      stats["produced"] = seq
    if time.monotonic() - last_log > 10:
      last_log = time.monotonic()
      log.info("rollout worker %d: version %s, %d files, %.0f tokens/s", w, stats["version"], seq,
               stats["tokens"] / max(stats["rollout_s"], 1e-9))
