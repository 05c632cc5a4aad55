"""`jaxpod plot RUN_DIR`: the task's metric curves (train and eval) to a PNG.

The panels are the task's `plot_metrics` read from the run's config.json (TRM: loss, and exact
and cell accuracy; LM: loss and perplexity): one panel per entry, every space-separated name
in it drawn as its training series and its `eval/<name>` series when logged.
"""
from __future__ import annotations

import dataclasses
import io
import json

from jaxpod.runtime import storage
from jaxpod.train.tracker import read_metrics


@dataclasses.dataclass(frozen=True)
class PlotConfig:
  """What to plot and where."""

  run_dir: str = ""  # the run folder holding metrics.jsonl (local path or URL)
  out: str | None = None  # output PNG (default: <run_dir>/metrics.png)

  def __post_init__(self):
    if not self.run_dir:
      raise ValueError("plot.run_dir is required: jaxpod plot RUN_DIR")


def _series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
  pts = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
  return [p[0] for p in pts], [p[1] for p in pts]


DEFAULT_PANELS = ("loss",)  # a run folder without a config.json (or an older one)


def panels_of(run_dir: str) -> tuple[str, ...]:
  """The `task.plot_metrics` of the run's config.json, else DEFAULT_PANELS."""
  url = storage.join(run_dir, "config.json")
  try:
    panels = json.loads(storage.read_text(url))["task"]["plot_metrics"] if storage.exists(url) else None
  except (ValueError, KeyError, TypeError):
    panels = None
  return tuple(panels) if panels else DEFAULT_PANELS


def plot_run(run_dir: str, out: str | None = None, panels: tuple[str, ...] | None = None) -> str:
  """Draw one panel per entry of `panels` (default: the run's task.plot_metrics) against step; returns the PNG path."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  records = read_metrics(run_dir)
  if not any(isinstance(r, dict) and "step" in r for r in records):
    raise ValueError(f"{storage.join(run_dir, 'metrics.jsonl')} holds no metrics records (JSON lines with a "
                     "'step'); is it a jaxpod run's metrics file?")
  records = [r for r in records if isinstance(r, dict) and "step" in r]
  out = out or storage.join(run_dir, "metrics.png")
  panels = panels or panels_of(run_dir)
  fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
  for ax, panel in zip(axes[0], panels):
    names = panel.split()
    for name in names:
      for key, label, style in ((name, f"train {name}", "-"), (f"eval/{name}", f"eval {name} (held out)", "o-")):
        x, y = _series(records, key)
        if x:
          ax.plot(x, y, style, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel(names[0] if len(names) == 1 else panel.replace(" ", ", "))
    if any("loss" in n or "perplexity" in n for n in names):
      ax.set_yscale("log")
    elif all("accuracy" in n for n in names):
      ax.set_ylim(0, 1.02)
    if ax.get_legend_handles_labels()[0]:
      ax.legend()
  fig.suptitle(storage.name(run_dir))
  fig.tight_layout()
  png = io.BytesIO()
  fig.savefig(png, format="png", dpi=100)
  plt.close(fig)
  storage.write_bytes(out, png.getvalue())
  return out
