"""Metrics sinks, leader only (invariant 4): JSONL always, TensorBoard, optional wandb.

`metrics.jsonl` in the run folder has one object per logged step: `{"step": k, "time": t, ...}`.
`jaxpod plot` reads it back. Other hosts get a tracker that drops everything.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

from jaxpod.train.config import TrackerConfig

METRICS_FILE = "metrics.jsonl"


class Tracker:
  """Writes `log(step, metrics)` to every enabled sink; a no-op on non-leaders."""

  def __init__(self, cfg: TrackerConfig, run_dir: str, is_leader: bool, config_dict: dict | None = None):
    self.enabled = is_leader
    self.run_dir = Path(run_dir)
    self._jsonl = None
    self._tb = None
    self._wandb = None
    if not self.enabled:
      return
    self.run_dir.mkdir(parents=True, exist_ok=True)
    self._jsonl = open(self.run_dir / METRICS_FILE, "a", buffering=1)
    if cfg.tensorboard:
      from tensorboardX import SummaryWriter
      self._tb = SummaryWriter(str(self.run_dir / "tb"))
    if cfg.wandb and cfg.wandb_mode != "disabled":
      import wandb  # imported only when enabled
      self._wandb = wandb.init(project=cfg.wandb_project, mode=cfg.wandb_mode, dir=str(self.run_dir),
                               name=self.run_dir.name, config=config_dict or {})

  def truncate_after(self, step: int) -> None:
    """Drop records past `step` (a resumed run logs those steps again)."""
    if not self.enabled:
      return
    self._jsonl.close()
    path = self.run_dir / METRICS_FILE
    keep = [r for r in read_metrics(str(self.run_dir)) if r.get("step", 0) <= step]
    path.write_text("".join(json.dumps(r) + "\n" for r in keep))
    self._jsonl = open(path, "a", buffering=1)

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

  def close(self) -> None:
    if self._jsonl is not None:
      self._jsonl.close()
      self._jsonl = None
    if self._tb is not None:
      self._tb.close()
      self._tb = None
    if self._wandb is not None:
      self._wandb.finish()
      self._wandb = None


def read_metrics(run_dir: str) -> list[dict]:
  """The JSONL records of a run, in order (a torn last line is skipped)."""
  path = Path(run_dir) / METRICS_FILE
  if not path.is_file():
    raise FileNotFoundError(f"{path} not found; is {run_dir} a jaxpod run folder?")
  out = []
  for line in path.read_text().splitlines():
    try:
      out.append(json.loads(line))
    except ValueError:
      continue
  return out
