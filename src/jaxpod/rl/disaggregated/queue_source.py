"""The disaggregated trainer's side of the queue: it consumes rollouts, watches the workers (and publishes its
weights every step through `publish.PublishPolicy`). `run.py` builds it and hands it to the GRPO task.

Before step k+1 the trainer holds policy version k (the weights after k steps). Its iterator
(`QueueSource`) takes `num_prompts_per_step` groups from the queue that `grpo.admit` admits (every
token made by a version in [k - max_policy_lag, k], invariant 9; rewards that differ with
filter_groups); the others are dropped and counted by reason (`rl/dropped_stale`, `_future`,
`_uniform`). The leader lists and picks; the pick (file names and group indices, never data) is broadcast;
every host reads those files from storage and builds the same global batch, then takes its share.

While a batch waits the leader logs a progress line every WAIT_LINE_S (groups taken, and dropped by
reason, per worker). `grpo.BatchFill` bounds the wait as in the colocated topology: once
max_sampling_rounds x sample_prompts_per_step groups were judged on their rewards without filling the
batch, the leader tells the workers to stop (progress record: done, stopped) and broadcasts the one line;
every trainer host raises it (`grpo.Starved`, exit 2; or `grpo.Solved` when the policy solves the problems it
draws: the run ends at its last step, exit 0, and the workers are told the trainer is done).

While it waits, the leader reads the workers' heartbeats: a worker whose heartbeat stops
changing for `rollout.worker_timeout_s` is named as lost (once), one that comes back is named as
rejoined; training goes on with whoever produces rollouts. No usable rollout for
`rollout.rollout_timeout_s` fails the run with the workers' states.

"""
from __future__ import annotations

import concurrent.futures
import time

from jaxpod import runtime
from jaxpod.rl import grpo
from jaxpod.rl.config import GRPOConfig, RolloutConfig
from jaxpod.rl.disaggregated.queue import Consumed, Queue, parse_name
from jaxpod.rl.batch import Batcher, BatchSource
from jaxpod.runtime.hooks import Hook, StepInfo
from jaxpod.runtime.log import get_logger
from jaxpod.transfer.config import TransferConfig

log = get_logger("rl.trainer")
POLL_S = (0.05, 0.5)  # first and longest sleep while waiting for rollouts
HEARTBEAT_CHECK_S = 2.0
WAIT_LINE_S = 10.0  # while a batch waits, a progress line this often (taken, dropped by reason, per worker)


class WorkerMonitor:
  """The leader's view of the rollout workers, from their heartbeats (staleness on this host's clock)."""

  def __init__(self, queue: Queue, timeout_s: float):
    self.queue, self.timeout_s = queue, timeout_s
    self.seen: dict[int, dict] = {}  # worker -> {incarnation, beat, changed (monotonic), lost, record}
    self._last = 0.0

  def check(self, force: bool = False) -> None:
    now = time.monotonic()
    if not force and now - self._last < HEARTBEAT_CHECK_S:
      return
    self._last = now
    for w, rec in sorted(self.queue.heartbeats().items()):
      known = self.seen.get(w)
      key = (rec.get("incarnation"), rec.get("beat"))
      if known is None:
        log.info("rollout worker %d joined (%d host(s), version %s)", w, rec.get("hosts", 1), rec.get("version"))
        self.seen[w] = {"key": key, "changed": now, "lost": False, "record": rec}
        continue
      if key != known["key"]:
        if known["lost"] or rec.get("incarnation") != known["key"][0]:
          log.warning("rollout worker %d rejoined (new incarnation %s, version %s)", w, rec.get("incarnation"),
                      rec.get("version"))
        known.update(key=key, changed=now, lost=False, record=rec)
      elif not known["lost"] and now - known["changed"] > self.timeout_s:
        known["lost"] = True
        alive = self.alive()
        log.warning("rollout worker %d lost: no heartbeat for %.0f s (last version %s, %s files written); "
                    "training continues with worker(s) %s", w, now - known["changed"], rec.get("version"),
                    rec.get("produced"), alive or "none (waiting for a worker)")

  def alive(self) -> list[int]:
    return [w for w, s in sorted(self.seen.items()) if not s["lost"]]

  def describe(self) -> str:
    if not self.seen:
      return "no rollout worker has written a heartbeat"
    return "; ".join(f"worker {w}: {'lost' if s['lost'] else 'alive'}, version {s['record'].get('version')}"
                     for w, s in sorted(self.seen.items()))


class QueueSource(BatchSource):
  """The trainer's iterator over the rollout queue (see the module docstring); its state is `Consumed`."""

  def __init__(self, run_dir: str, transfer: TransferConfig | None, grpo_cfg: GRPOConfig, rollout: RolloutConfig,
               batcher: Batcher):
    self.transfer, self.batcher = transfer, batcher
    self.grpo = grpo_cfg
    self.rollout_timeout_s = rollout.rollout_timeout_s
    self.queue = Queue(run_dir)
    self.consumed = Consumed()
    self.trained = 0  # batches handed to the trainer = the version the next step trains from
    self.monitor = WorkerMonitor(self.queue, rollout.worker_timeout_s)
    self.files: dict[str, list] = {}  # file -> its groups (read once)
    self.counts = {"dropped_stale": 0, "dropped_future": 0, "dropped_uniform": 0, "groups": 0}
    self.step_stats: dict = {}
    self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rl-progress")
    self._last_report: dict | None = None

  def _groups(self, name: str) -> list:
    if name not in self.files:
      self.files[name] = self.queue.read(name)[0]
    return self.files[name]

  def _pick(self, version: int) -> dict:
    """Leader: {"take": [[file, [groups]]], "drop": [[file, group, why]], "waited": s} once enough groups are
    admitted (`grpo.admit`: the one rule both topologies use), scanning files oldest first, workers interleaved;
    {"starved" or "solved": the one line} once `grpo.BatchFill` gives up on the batch (the colocated bound)."""
    fill = self.grpo.batch_fill(version)
    take, drop = {}, []
    t0, sleep = time.monotonic(), POLL_S[0]
    last_line = t0
    examined: set[tuple[str, int]] = set()
    while True:
      self.monitor.check()
      for name in sorted(self.queue.files(), key=lambda n: parse_name(n)[::-1]):
        if fill.full or fill.starved():
          break
        if self.consumed.is_full(name):
          continue
        groups, done = self._groups(name), self.consumed.taken(name)
        fresh = [i for i in range(len(groups)) if i not in done and (name, i) not in examined]
        taken, dropped = fill.take([groups[i] for i in fresh], f"worker {parse_name(name)[0]}")
        examined.update((name, fresh[j]) for j in taken + [j for j, _ in dropped])
        if taken:
          take.setdefault(name, []).extend(fresh[j] for j in taken)
        drop += [[name, fresh[j], why] for j, why in dropped]
      waited = time.monotonic() - t0
      if fill.full:
        return {"take": [[k, v] for k, v in take.items()], "drop": drop, "waited": waited}
      if fill.starved():
        solved = fill.solved()
        log.warning("rl trainer: gave up on step %d after %.0f s: %s", version + 1, waited, fill.describe())
        self._report(done=True, stopped=not solved)  # the workers stop: nothing more is taken
        return {"solved" if solved else "starved": str(fill.give_up())}
      self._report(done=False, examined=set(take) | {d[0] for d in drop})
      if time.monotonic() - last_line >= WAIT_LINE_S:
        last_line = time.monotonic()
        log.info("rl trainer: waiting %.0f s for rollouts for step %d: %s", waited, version + 1, fill.describe())
      if waited > self.rollout_timeout_s:
        raise RuntimeError(f"rl trainer: no usable rollouts for {waited:.0f} s at version {version} "
                           f"({fill.describe()}; rl.grpo.max_policy_lag={self.grpo.max_policy_lag}); "
                           f"{self.monitor.describe()}")
      time.sleep(sleep)
      sleep = min(sleep * 2, POLL_S[1])

  def __next__(self) -> dict:
    version = self.trained
    pick = runtime.broadcast_call(lambda: self._pick(version), "rl.queue.pick",
                                  timeout_s=self.rollout_timeout_s + 120)
    if "starved" in pick:  # every host: the same line, exit 2 (invariant 1: decided on the leader)
      raise grpo.Starved(pick["starved"])
    if "solved" in pick:  # every host: the run ends at its last step (exit 0)
      raise grpo.Solved(pick["solved"])
    groups = [self._groups(name)[i] for name, idxs in pick["take"] for i in idxs]
    for name, idxs in pick["take"]:
      self.consumed.take(name, idxs, len(self._groups(name)))
    for name, i, why in pick["drop"]:
      self.consumed.take(name, [i], len(self._groups(name)))
      self.counts[f"dropped_{why}"] += 1
    self.counts["groups"] += len(groups)
    for name in [n for n in self.files if self.consumed.is_full(n)]:
      del self.files[name]  # whole files taken: never read again
    newest = [g.newest_version() for g in groups]
    self.step_stats = {"rl/took": [f"{name}:{','.join(map(str, idxs))}" for name, idxs in pick["take"]],
                       "rl/dropped": [f"{name}:{i}:{why}" for name, i, why in pick["drop"]],
                       "rl/waiting_s": pick["waited"], "rl/behaviour_version": sum(newest) / len(newest),
                       "rl/lag": version - sum(g.oldest_version() for g in groups) / len(groups),
                       "rl/rollout_tokens": sum(g.policy_tokens() for g in groups),
                       **{f"rl/{k}": float(v) for k, v in self.counts.items()},
                       "rl/workers_alive": float(len(self.monitor.alive()))}
    self.trained += 1
    self._report(done=False)
    return self.batcher(groups)

  def _report(self, done: bool, examined: set[str] = frozenset(), stopped: bool = False) -> None:
    """Leader: the progress record workers bound their backlog with (written in the background; with `done`,
    before returning; `stopped`: the trainer ends without finishing). Files the leader has examined in a pick
    still under way count as taken: their groups are spoken for, and a worker that waited for the pick to end
    would starve a trainer that drops many groups (filter_groups)."""
    if runtime.is_leader():
      taken = dict(self.consumed.taken_files)
      for name in examined:
        if not self.consumed.taken(name):
          w = parse_name(name)[0]
          taken[w] = taken.get(w, 0) + 1
      record = {"step": self.trained, "taken_files": {str(w): n for w, n in taken.items()}, "done": done,
                **({"stopped": True} if stopped else {})}
      if record == self._last_report:
        return
      self._last_report = record
      future = self._writer.submit(self.queue.set_progress, record)
      if done:
        future.result()

  def get_state(self) -> dict:
    return {"trained": self.trained, "consumed": self.consumed.state(), "counts": self.counts}

  def set_state(self, state: dict) -> None:
    self.trained = int(state["trained"])
    self.consumed = Consumed.from_state(state["consumed"])
    self.counts = {**self.counts, **state["counts"]}

  def hooks(self, graphdef, mesh) -> list:
    from jaxpod.rl.disaggregated.publish import PublishPolicy
    return [PublishPolicy(self.transfer), QueueStats(self)]

  def close(self) -> None:
    self._report(done=True)
    self._writer.shutdown(wait=True)


class QueueStats(Hook):
  """Every step: waiting time, staleness and dropped counts, live workers; at the end: tells workers to stop."""

  def __init__(self, source: QueueSource):
    self.source = source
    self.last_end: float | None = None  # the span between calls: waiting, the train step, publishing, eval

  def due(self, step: int, final: bool) -> bool:
    return True

  def on_start(self, info: StepInfo) -> None:
    if runtime.is_leader():
      self.source.monitor.check(force=True)

  def __call__(self, info: StepInfo) -> dict:
    now = time.perf_counter()
    interval = now - self.last_end if self.last_end is not None else 0.0
    self.last_end = now
    return {**self.source.step_stats, "rl/interval_s": interval}

  def close(self) -> None:
    self.source.close()
