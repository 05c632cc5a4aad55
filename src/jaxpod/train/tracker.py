"""Metrics sinks, leader only (invariant 4): JSONL always, TensorBoard, optional wandb; to any URL.

`metrics.jsonl` in the run folder has one object per logged step: `{"step": k, "time": t, ...}`.
`jaxpod plot` reads it back. Other hosts get a tracker that drops everything.

A local run folder is written in place (appends, `tail -f` works). A bucket cannot append, so
for a gs:// run folder the sinks write into a staging folder on the leader's local disk and
`sync()` copies what changed into the run folder every `sync_every_s` seconds, before every
checkpoint and at the end; a preempted leader loses at most that many seconds of log lines,
and a resumed run truncates the log to the restored step anyway.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time

from jaxpod.runtime import storage
from jaxpod.train.config import TrackerConfig

METRICS_FILE = "metrics.jsonl"


class Tracker:
  """Writes `log(step, metrics)` to every enabled sink; a no-op on non-leaders."""

  def __init__(self, cfg: TrackerConfig, run_dir: str, is_leader: bool, config_dict: dict | None = None):
    self.enabled = is_leader
    self.run_dir = run_dir
    self.sync_every_s = cfg.sync_every_s
    self._jsonl = self._tb = self._wandb = None
    self._staging = None
    self._last_sync = time.monotonic()
    self._uploaded: dict = {}  # staged file -> (size, mtime) last uploaded: unchanged files are not sent again
    if not self.enabled:
      return
    if storage.is_remote(run_dir):
      self._staging = tempfile.mkdtemp(prefix="jaxpod-tracker-")
      self.local_dir = self._staging
      if storage.exists(storage.join(run_dir, METRICS_FILE)):  # a resumed run continues the bucket's log
        storage_bytes = storage.read_bytes(storage.join(run_dir, METRICS_FILE))
        with open(os.path.join(self._staging, METRICS_FILE), "wb") as f:
          f.write(storage_bytes)
    else:
      self.local_dir = run_dir
      os.makedirs(run_dir, exist_ok=True)
    self._jsonl = open(os.path.join(self.local_dir, METRICS_FILE), "a", buffering=1)
    if cfg.tensorboard:
      from tensorboardX import SummaryWriter
      self._tb = SummaryWriter(os.path.join(self.local_dir, "tb"))
    if cfg.wandb and cfg.wandb_mode != "disabled":
      import wandb  # imported only when enabled
      self._wandb = wandb.init(project=cfg.wandb_project, mode=cfg.wandb_mode, dir=self.local_dir,
                               name=storage.name(run_dir), config=config_dict or {})

  def truncate_after(self, step: int) -> None:
    """Drop records past `step` (a resumed run logs those steps again)."""
    if not self.enabled:
      return
    self._jsonl.close()
    path = os.path.join(self.local_dir, METRICS_FILE)
    keep = [r for r in _parse(open(path, encoding="utf-8").read()) if r.get("step", 0) <= step]
    with open(path, "w", encoding="utf-8") as f:
      f.write("".join(json.dumps(r) + "\n" for r in keep))
    self._jsonl = open(path, "a", buffering=1)
    self.sync(force=True)

  def log(self, step: int, metrics: dict) -> None:
    if not self.enabled or not metrics:
      return
    clean = {k: (float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v)
             for k, v in metrics.items()}
    self._jsonl.write(json.dumps({"step": int(step), "time": time.time(), **clean}) + "\n")
    if self._tb is not None:
      for k, v in clean.items():
        if isinstance(v, float) and math.isfinite(v):
          self._tb.add_scalar(k, v, int(step))
    if self._wandb is not None:
      self._wandb.log(clean, step=int(step))
    self.sync()

  def sync(self, force: bool = False) -> None:
    """Copy the staged sinks into a bucket run folder (every `sync_every_s` s, or now with force)."""
    if self._staging is None or (not force and time.monotonic() - self._last_sync < self.sync_every_s):
      return
    self._jsonl.flush()
    if self._tb is not None:
      self._tb.flush()
    storage.upload(self._staging, self.run_dir, self._uploaded)
    self._last_sync = time.monotonic()

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()
      self._tb = None
    if self._wandb is not None:
      self._wandb.finish()
      self._wandb = None
    if self._jsonl is not None:
      self.sync(force=True)
      self._jsonl.close()
      self._jsonl = None
    if self._staging is not None:
      shutil.rmtree(self._staging, ignore_errors=True)
      self._staging = None


def _parse(text: str) -> list[dict]:
  out = []
  for line in text.splitlines():
    try:
      out.append(json.loads(line))
    except ValueError:  # a torn last line
      continue
  return out


def read_metrics(run_dir: str) -> list[dict]:
  """The JSONL records of a run (local path or URL), in order (a torn last line is skipped)."""
  url = storage.join(run_dir, METRICS_FILE)
  if not storage.exists(url):
    raise FileNotFoundError(f"{url} not found; is {run_dir} a jaxpod run folder?")
  return _parse(storage.read_text(url))
