"""`jaxpod rl --topology disaggregated` with role auto: the trainer and the rollout workers as separate
JAX clusters on this machine, each started by jaxpod's launcher, joined only by the run's storage.

On a pod the same two roles run as two jobs (two slices, two node pools) with the same config:

    jaxpod rl --config_path rl.yaml --topology disaggregated --role trainer                # on the trainer hosts
    jaxpod rl --config_path rl.yaml --topology disaggregated --role rollout --rollout.worker_id 0   # per worker

Here, `trainer_hosts` hosts train and `rollout.workers` workers of `rollout.hosts` hosts each sample;
every cluster's lines are echoed from its leader with a label (`[trainer host 0/2]`, `[worker1 host 0/2]`),
full logs go to `<run>/logs/` (a local run folder) or a temporary folder. A local runs folder is shared
by the simulated hosts (it is this machine's disk, declared shared); a bucket needs nothing shared. When
the trainer ends (done or failed) the workers are stopped; the job's exit code is the trainer's.
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
  from jaxpod.runtime.launcher import LaunchConfig, launch
  storage.makedirs(folder)
  path = _config_file(cfg, folder)
  local = not storage.is_remote(folder)
  logs = storage.join(folder, "logs") if local else tempfile.mkdtemp(prefix="jaxpod-rl-logs-")
  devices = cfg.runtime.devices_per_host or 1
  base = [sys.executable, "-m", "jaxpod.cli.main", "rl", "--config_path", path, "--topology", "disaggregated"]
  env = _child_env(cfg)
  stop = threading.Event()
  results: dict[str, object] = {}

  def start(name: str, argv: list[str], hosts: int) -> threading.Thread:
    lc = LaunchConfig(hosts=hosts, devices_per_host=devices, log_dir=storage.join(logs, name),
                      shared_local_disk=local, label=f"{name} ")
    thread = threading.Thread(target=lambda: results.__setitem__(name, launch(base + argv, lc, env=env,
                                                                                echo_hosts={0}, stop=stop)),
                              name=f"rl-{name}", daemon=True)
    thread.start()
    return thread

  log.info("rl: trainer (%d host(s)) and %d rollout worker(s) (%d host(s) each) in %s", cfg.trainer_hosts,
           cfg.rollout.workers, cfg.rollout.hosts, folder)
  trainer = start("trainer", ["--role", "trainer"], cfg.trainer_hosts)
  workers = [start(f"worker{i}", ["--role", "rollout", "--rollout.worker_id", str(i)], cfg.rollout.hosts)
             for i in range(cfg.rollout.workers)]
  previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())  # a preempted job stops both clusters cleanly
  try:
    while trainer.is_alive() and not stop.is_set():
      failed = [f"worker{i}" for i, t in enumerate(workers) if not t.is_alive()
                and results.get(f"worker{i}") is not None and results[f"worker{i}"].returncode != 0]
      if len(failed) == len(workers):
        log.error("rl: every rollout worker failed (%s); stopping the trainer", ", ".join(failed))
        stop.set()
      time.sleep(0.5)
    trainer.join()
    for t in workers:
      t.join(WORKERS_GRACE_S)
    stop.set()
    for t in workers:
      t.join()
  except KeyboardInterrupt:
    stop.set()
    trainer.join()
    raise
  finally:
    signal.signal(signal.SIGTERM, previous)
    os.unlink(path)
  rc = results["trainer"].returncode
  if rc != 0:
    raise SystemExit(rc)
  summary = storage.join(folder, "summary.json")
  return json.loads(storage.read_text(summary)) if storage.exists(summary) else None


def _child_env(cfg: RLConfig) -> dict:
  """The clusters' environment: this one, plus a per-run transfer secret when the transport listens off-host
  (generated here, handed over in the environment only, never logged)."""
  from jaxpod.transfer.secrets import ensure_secret
  env = dict(os.environ)
  env.pop("JAX_NUM_CPU_DEVICES", None)
  return ensure_secret(env, cfg.transfer.secret_env) if cfg.transfer.off_host else env
