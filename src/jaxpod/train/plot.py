"""`jaxpod plot RUN_DIR`: training loss and accuracy curves (plus eval accuracy) to a PNG."""
from __future__ import annotations

import dataclasses
import io

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


def plot_run(run_dir: str, out: str | None = None) -> str:
  """Draw loss (left) and accuracy (right) against step; returns the PNG path."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  records = read_metrics(run_dir)
  if not any(isinstance(r, dict) and "step" in r for r in records):
    raise ValueError(f"{storage.join(run_dir, 'metrics.jsonl')} holds no metrics records (JSON lines with a "
                     "'step'); is it a jaxpod run's metrics file?")
  records = [r for r in records if isinstance(r, dict) and "step" in r]
  out = out or storage.join(run_dir, "metrics.png")
  fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
  for key, label, style in (("loss", "train loss", "-"), ("lm_loss", "train lm loss", "-"),
                            ("eval/loss", "eval loss (held out)", "o-")):  # eval/loss: the LM task
    x, y = _series(records, key)
    if x:
      ax_loss.plot(x, y, style, label=label)
  ax_loss.set_xlabel("step")
  ax_loss.set_ylabel("loss")
  ax_loss.set_yscale("log")
  ax_loss.legend()
  for key, label, style in (("exact_accuracy", "train exact (halted rows)", "-"), ("accuracy", "train cell", "-"),
                            ("eval/exact_accuracy", "eval exact (EMA, held out)", "o-"),
                            ("eval/accuracy", "eval cell", "s--")):
    x, y = _series(records, key)
    if x:
      ax_acc.plot(x, y, style, label=label)
  ax_acc.set_xlabel("step")
  ax_acc.set_ylabel("accuracy")
  ax_acc.set_ylim(0, 1.02)
  if ax_acc.get_legend_handles_labels()[0]:  # the LM task logs no accuracy
    ax_acc.legend(loc="lower right")
  fig.suptitle(storage.name(run_dir))
  fig.tight_layout()
  png = io.BytesIO()
  fig.savefig(png, format="png", dpi=100)
  plt.close(fig)
  storage.write_bytes(out, png.getvalue())
  return out
