"""`jaxpod rl --topology disaggregated` with role auto: the trainer and the rollout workers as separate
JAX clusters on this machine, each started by jaxpod's launcher, joined only by the run's storage.

On a pod the same two roles run as two jobs (two slices, two node pools) with the same config:

    jaxpod rl --config_path rl.yaml --topology disaggregated --role trainer                # on the trainer hosts
    jaxpod rl --config_path rl.yaml --topology disaggregated --role rollout --rollout.worker_id 0   # per worker

Here, `trainer_hosts` hosts train and `rollout.workers` workers of `rollout.hosts` hosts each sample;
every cluster's lines are echoed from its leader with a label (`[trainer host 0/2]`, `[worker1 host 0/2]`),
full logs go to `<run>/logs/` (a local run folder) or a temporary folder. A local runs folder is shared
by the simulated hosts (it is this machine's disk, declared shared); a bucket needs nothing shared.

The workers wait for the trainer's first version (its warm-up) as long as the trainer runs
(AUTO_WAIT_S): this process stops them if the trainer ends without publishing, so
`rollout.wait_for_weights_s` bounds only workers started on their own (`--role rollout`).
When the trainer finishes, the workers get WORKERS_GRACE_S to read its "done" and exit; when it fails
or is preempted (exit 143) they are stopped at once; the job's exit code is the trainer's. SIGTERM to
this process (a preemption notice: ~30 s left) is passed to the trainer's hosts, which save and exit
143 (SIGKILL after PREEMPT_GRACE_S), the workers are stopped, and the command exits 143: rerun it to
resume.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import sys
import tempfile
import threading
import time

from jaxpod.rl.config import RLConfig
from jaxpod.runtime import storage
from jaxpod.runtime.log import get_logger

log = get_logger("rl.launch")
WORKERS_GRACE_S = 60.0  # after the trainer is done, how long workers get to see it and exit
PREEMPT_GRACE_S = 20.0  # SIGTERM -> SIGKILL for the trainer's hosts: their time to save a checkpoint
PREEMPTED = 143  # 128 + SIGTERM: what a preempted jaxpod job exits with
AUTO_WAIT_S = 86400.0  # role auto: the workers' rollout.wait_for_weights_s (a warm-up may take long; a day)


def _config_file(cfg: RLConfig, folder: str) -> str:
  """The config as YAML in a local file the clusters read (host identity left to the launcher)."""
  import draccus
  runtime = dataclasses.replace(cfg.runtime, num_processes=None, process_id=None, coordinator=None,
                                devices_per_host=None)
  text = draccus.dump(dataclasses.replace(cfg, runtime=runtime, role="auto"))
  fd, path = tempfile.mkstemp(prefix="jaxpod-rl-", suffix=".yaml")
  with os.fdopen(fd, "w") as f:
    f.write(text)
  return path


def run_clusters(cfg: RLConfig, folder: str) -> dict | None:
  """Launch the trainer cluster and the worker clusters; wait; return the trainer's summary."""
  import json
  from jaxpod.runtime.launcher import LaunchConfig
  storage.makedirs(folder)
  path = _config_file(cfg, folder)
  local = not storage.is_remote(folder)
  logs = storage.join(folder, "logs") if local else tempfile.mkdtemp(prefix="jaxpod-rl-logs-")
  devices = cfg.runtime.devices_per_host or 1
  base = [sys.executable, "-m", "jaxpod.cli.main", "rl", "--config_path", path, "--topology", "disaggregated"]

  def cluster(name: str, argv: list[str], hosts: int, grace_s: float):
    return base + argv, LaunchConfig(hosts=hosts, devices_per_host=devices, log_dir=storage.join(logs, name),
                                     shared_local_disk=local, label=f"{name} ", grace_s=grace_s)

  log.info("rl: trainer (%d host(s)) and %d rollout worker(s) (%d host(s) each) in %s", cfg.trainer_hosts,
           cfg.rollout.workers, cfg.rollout.hosts, folder)
  clusters = {"trainer": cluster("trainer", ["--role", "trainer"], cfg.trainer_hosts, PREEMPT_GRACE_S)}
  for i in range(cfg.rollout.workers):
    clusters[f"worker{i}"] = cluster(f"worker{i}", ["--role", "rollout", "--rollout.worker_id", str(i),
                                                    "--rollout.wait_for_weights_s", str(AUTO_WAIT_S)],
                                     cfg.rollout.hosts, 5.0)
  try:
    rc = supervise(clusters, _child_env(cfg))
  finally:
    os.unlink(path)
  if rc != 0:
    raise SystemExit(rc)
  summary = storage.join(folder, "summary.json")
  return json.loads(storage.read_text(summary)) if storage.exists(summary) else None


def supervise(clusters: dict, env: dict | None = None) -> int:
  """Run {"trainer": (argv, LaunchConfig), "<worker>": ...} as launched clusters, each stopped on its own (see
  the module docstring); returns the job's exit code. Call it from the main thread (it handles SIGTERM)."""
  from jaxpod.runtime.launcher import launch
  stops = {name: threading.Event() for name in clusters}
  results: dict[str, object] = {}
  preempted = threading.Event()

  def start(name: str) -> threading.Thread:
    argv, lc = clusters[name]
    run = lambda: results.__setitem__(name, launch(argv, lc, env=env, echo_hosts={0}, stop=stops[name]))  # noqa: E731
    thread = threading.Thread(target=run, name=f"rl-{name}", daemon=True)
    thread.start()
    return thread

  def on_sigterm(*_) -> None:
    preempted.set()
    for stop in stops.values():  # the trainer's hosts get SIGTERM: they save and exit 143
      stop.set()

  threads = {name: start(name) for name in clusters}
  workers = [name for name in clusters if name != "trainer"]
  previous = signal.signal(signal.SIGTERM, on_sigterm)
  try:
    while threads["trainer"].is_alive():
      failed = [w for w in workers if not threads[w].is_alive() and results.get(w) is not None
                and results[w].returncode != 0]
      if workers and len(failed) == len(workers) and not stops["trainer"].is_set():
        log.error("rl: every rollout worker failed (%s); stopping the trainer", ", ".join(failed))
        stops["trainer"].set()
      time.sleep(0.2)
    rc = results["trainer"].returncode
    if preempted.is_set():
      log.warning("rl: SIGTERM: the trainer saved and stopped, the rollout workers are stopped; exit %d (rerun the "
                  "same command to resume)", PREEMPTED)
    elif rc == 0:
      for name in workers:
        threads[name].join(WORKERS_GRACE_S)
    else:  # failed or preempted: it will not write the "done" the workers wait for
      log.warning("rl: the trainer exited %d%s; stopping the rollout workers now", rc,
                  " (preempted: rerun the same command to resume)" if rc == PREEMPTED else "")
    for stop in stops.values():
      stop.set()
    for thread in threads.values():
      thread.join()
  except KeyboardInterrupt:
    for stop in stops.values():
      stop.set()
    threads["trainer"].join()
    raise
  finally:
    signal.signal(signal.SIGTERM, previous)
  return PREEMPTED if preempted.is_set() else rc


def _child_env(cfg: RLConfig) -> dict:
  """The clusters' environment: this one, plus a per-run transfer secret when the transport listens off-host
  (generated here, handed over in the environment only, never logged)."""
  from jaxpod.transfer.secrets import ensure_secret
  env = dict(os.environ)
  env.pop("JAX_NUM_CPU_DEVICES", None)
  return ensure_secret(env, cfg.transfer.secret_env) if cfg.transfer.off_host else env
