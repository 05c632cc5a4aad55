"""`jaxpod bench trm-parity --reference DIR`: convergence of jaxpod's TRM against the reference's, N seeds each.

For each seed S, both sides train the default recipe of `jaxpod train` (or the one given) on the
same jaxpod-built dataset and the same global batches, in the same order:
- jaxpod: `jaxpod train --trainer.seed S --task.data.seed S` in a child process (its own run folder);
- reference: its own model, `ACTLossHead`, AdamATan2 (the reference formula, in torch) and sparse
  sign-SGD from an unmodified checkout (`jaxpod.bench.trm.reference --train-data`), fed the batches
  jaxpod's loader gives for seed S, with jaxpod's schedule and EMA decay.
Both evaluate held-out exact accuracy with EMA weights at the same steps. The table gives the median
and the range over seeds per step; the PNG shows both sides' median and spread.

Deviations of the reference side, all forced by running it without its trainer: the softmax loss is
wrapped to drop `valid_mask=` (see `reference.py`); the model seed is torch's, so initial weights
differ from jaxpod's for the same S (the batches do not); the EMA skips the sparse puzzle embedding
(the reference's EMAHelper covers parameters only); no torch.compile, fp32 on CPU.
"""
from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from jaxpod.bench.common import machine, print_table, write_json
from jaxpod.bench.trm.reference import check_reference_dir, missing_packages


@dataclasses.dataclass(frozen=True)
class TRMParityBench:
  """Options of `jaxpod bench trm-parity`."""

  reference: str | None = None  # a TinyRecursiveModels checkout (required; needs jaxpod[bench])
  seeds: int = 3  # seeds 0..seeds-1 on each side (model and data seed)
  steps: int = 400  # training steps per run (the default recipe's)
  eval_every: int = 50  # held-out evaluation cadence (both sides)
  config: str | None = None  # a `jaxpod train` YAML; default: the built-in default recipe
  threads: int = 0  # torch threads of the reference side (0: torch's default)
  json: str | None = "trm_parity.json"  # results; the plot goes beside it as trm_parity.png
  workdir: str | None = None  # where the runs and the dataset go; default: a temporary folder


def cli(cfg: TRMParityBench) -> int:
  """Entry of `jaxpod bench trm-parity`."""
  if not cfg.reference:
    raise SystemExit("jaxpod bench trm-parity: error: --reference DIR is required (a TinyRecursiveModels checkout)")
  run(cfg)
  return 0


def _train_args(cfg: TRMParityBench, seed: int, runs_dir: str) -> list[str]:
  return [*(["--config_path", cfg.config] if cfg.config else []), "--trainer.seed", str(seed),
          "--task.data.seed", str(seed), "--trainer.steps", str(cfg.steps), "--trainer.eval_every", str(cfg.eval_every),
          "--trainer.runs_dir", runs_dir, "--trainer.run_name", f"seed{seed}", "--trainer.checkpoint_every", "0"]


def _child(cmd: list[str], what: str) -> subprocess.CompletedProcess:
  """Run one side in its own process; its last error line if it fails."""
  proc = subprocess.run(cmd, capture_output=True, text=True)
  if proc.returncode:
    last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""
    raise RuntimeError(f"bench trm-parity: {what} exited {proc.returncode}: {last}")
  return proc


def _run_config(run_dir: str):
  """The TrainConfig a finished `jaxpod train` ran with (its config.json), so both sides share it exactly."""
  import draccus
  from jaxpod.runtime import storage
  from jaxpod.train.config import TrainConfig
  return draccus.decode(TrainConfig, json.loads(storage.read_text(storage.join(run_dir, "config.json"))))


def _jaxpod_side(cfg: TRMParityBench, seed: int, runs_dir: str) -> tuple[list[dict], float]:
  """Runs `jaxpod train` for one seed; (eval curve, wall seconds)."""
  from jaxpod.runtime import storage
  from jaxpod.train.tracker import read_metrics
  t = time.perf_counter()
  _child([sys.executable, "-m", "jaxpod.cli.main", "train", *_train_args(cfg, seed, runs_dir)],
         f"jaxpod train (seed {seed})")
  curve = [{"step": r["step"], "exact_accuracy": r["eval/exact_accuracy"]}
           for r in read_metrics(storage.join(runs_dir, f"seed{seed}")) if "eval/exact_accuracy" in r]
  return curve, time.perf_counter() - t


def _batches(train_cfg, steps: int, path: str) -> None:
  """The global batches jaxpod's loader gives for this config's data seed, as an .npz the reference reads."""
  import numpy as np
  from jaxpod.data.sudoku import SudokuLoader
  from jaxpod.tasks.trm_sudoku import SudokuTask
  d = train_cfg.task.data
  loader = SudokuLoader(SudokuTask(train_cfg).prepare(), d.global_batch_size, seed=d.seed,
                        eval_batch_size=d.eval_batch_size)
  train = [loader.train_batch(i) for i in range(steps)]
  evals = [loader.eval_batch(i) for i in range(loader.eval_steps)]
  keys = ("inputs", "labels", "puzzle_identifiers")
  np.savez(path, **{f"train_{k}": np.stack([b[k] for b in train]) for k in keys},
           **{f"eval_{k}": np.stack([b[k] for b in evals]) for k in keys})


def _reference_side(cfg: TRMParityBench, train_cfg, seed: int, tmp: str) -> tuple[list[dict], float]:
  """Trains the reference on the same batches for one seed; (eval curve, wall seconds)."""
  task = train_cfg.task
  data, spec = os.path.join(tmp, f"batches{seed}.npz"), os.path.join(tmp, f"spec{seed}.json")
  _batches(train_cfg, cfg.steps, data)
  optim = {k: getattr(task.optim, k) for k in ("lr", "beta1", "beta2", "weight_decay", "puzzle_emb_lr",
                                               "puzzle_emb_weight_decay", "warmup_steps")}
  with open(spec, "w") as f:
    json.dump({"model_config": task.model.to_reference(task.data.global_batch_size), "loss_type": task.model.loss_type,
               "optim": optim, "seed": seed, "steps": cfg.steps, "eval_every": cfg.eval_every,
               "ema": train_cfg.trainer.ema}, f)
  t = time.perf_counter()
  proc = _child([sys.executable, "-m", "jaxpod.bench.trm.reference", "--reference", cfg.reference, "--spec", spec,
                 "--threads", str(cfg.threads), "--train-data", data], f"the reference (seed {seed})")
  curve = [json.loads(l) for l in proc.stdout.splitlines() if l.startswith("{")]
  return [{"step": c["step"], "exact_accuracy": c["exact_accuracy"]} for c in curve], time.perf_counter() - t


def _spread(curves: list[list[dict]]) -> dict[int, dict]:
  """Per step: median, min and max of exact accuracy over seeds."""
  by_step: dict[int, list[float]] = {}
  for curve in curves:
    for point in curve:
      by_step.setdefault(point["step"], []).append(point["exact_accuracy"])
  return {s: {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}
          for s, v in sorted(by_step.items())}


def plot(results: dict, path: str) -> str:
  """Both sides' median held-out exact accuracy with the min-max band over seeds, one PNG."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6.4, 4.0))
  for side, color in (("jaxpod", "tab:blue"), ("reference", "tab:orange")):
    spread = results[side]["spread"]
    steps = sorted(int(s) for s in spread)
    get = lambda k: [spread[s][k] * 100 for s in steps]  # noqa: E731
    ax.plot(steps, get("median"), color=color, marker="o", label=f"{side} (median of {len(results['seeds'])} seeds)")
    ax.fill_between(steps, get("min"), get("max"), color=color, alpha=0.2)
  ax.set_xlabel("training step")
  ax.set_ylabel("held-out exact accuracy (%)")
  ax.set_ylim(-2, 102)
  ax.grid(alpha=0.3)
  ax.legend(loc="lower right")
  ax.set_title("TRM convergence: jaxpod vs reference (same data, same batches)")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


def run(cfg: TRMParityBench) -> dict:
  """Train both sides for every seed; print the table, write the JSON and the PNG."""
  check_reference_dir(cfg.reference)
  missing = missing_packages()
  if missing:
    raise RuntimeError(f"bench trm-parity: the reference needs {missing}, missing from {sys.executable}; "
                       "install them: pip install 'jaxpod[bench]'")
  with tempfile.TemporaryDirectory() as tmp:
    work = cfg.workdir or tmp
    runs_dir = os.path.join(work, "runs")
    sides = {"jaxpod": ([], []), "reference": ([], [])}
    for seed in range(cfg.seeds):
      for side in ("jaxpod", "reference"):  # the reference reads the config jaxpod's run resolved
        curve, wall = (_jaxpod_side(cfg, seed, runs_dir) if side == "jaxpod" else
                       _reference_side(cfg, _run_config(os.path.join(runs_dir, f"seed{seed}")), seed, tmp))
        sides[side][0].append(curve)
        sides[side][1].append(wall)
        print(f"seed {seed} {side}: final exact accuracy {curve[-1]['exact_accuracy']:.4f}, {wall:.0f} s", flush=True)
  results = {"seeds": list(range(cfg.seeds)), "steps": cfg.steps, "config": cfg.config or "built-in default",
             "machine": machine(), "reference": os.path.abspath(cfg.reference)}
  for side, (curves, walls) in sides.items():
    results[side] = {"curves": curves, "wall_s": walls, "spread": _spread(curves),
                     "final": [c[-1]["exact_accuracy"] for c in curves]}
  ours, theirs = results["jaxpod"]["spread"], results["reference"]["spread"]
  fmt = lambda s: f"{s['median'] * 100:.1f}% ({s['min'] * 100:.1f}-{s['max'] * 100:.1f})"  # noqa: E731
  print_table(f"TRM convergence over {cfg.seeds} seeds: held-out exact accuracy, median (min-max)",
              ["step", "jaxpod", "reference"],
              [(str(s), fmt(ours[s]), fmt(theirs[s]) if s in theirs else "-") for s in ours])
  walls = [b / a for a, b in zip(results["jaxpod"]["wall_s"], results["reference"]["wall_s"])]
  results["reference_over_jaxpod_wall"] = statistics.median(walls)
  ratio = results["reference_over_jaxpod_wall"]
  print(f"wall time per run, median: jaxpod {statistics.median(results['jaxpod']['wall_s']):.0f} s, reference "
        f"{statistics.median(results['reference']['wall_s']):.0f} s (reference / jaxpod {ratio:.2f}x, "
        "same seeds, one after the other; jaxpod's includes process start, dataset check and compilation)")
  if cfg.json:
    results["plot"] = plot(results, os.path.splitext(cfg.json)[0] + ".png")
    print(f"plot: {results['plot']}")
  write_json(cfg.json, results)
  return results
