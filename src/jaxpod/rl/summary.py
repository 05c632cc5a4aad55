"""The end of `jaxpod rl`: `summary.json`, a console table, and `rl.png` (reward and accuracy per policy version).

Everything is read back from the runs' `metrics.jsonl` (warm-up and GRPO), so a resumed run
summarises its whole history, not just the last process's part. Keys of summary.json:

  accuracy.start / accuracy.end   held-out greedy exact match at the first and last GRPO step (fractions;
                                  also nested as accuracy: {start, end, warmup_start})
  reward_curve                    [[policy version that sampled, mean reward], ...] per GRPO step
  accuracy_curve                  [[policy version, held-out accuracy], ...] per evaluation
  pass_at_k                       with eval.k: {k, samples, "pass@1": {start, end, lift_points, curve}, "pass@k":
                                  {...}} (the unbiased estimator over `samples` samples, or sampled episodes, per
                                  held-out problem at the rollout temperature; on in the multi-turn examples)
  tokens_per_s                    sampled tokens per second of rollout time
  rows_per_step                   sequences per optimizer step (grpo.num_prompts_per_step x num_generations)
  steps, end_reason               the last GRPO step, and why it came before trainer.steps ("" if it did not:
                                  e.g. `grpo.Solved`, the policy solves the problems it draws)
  time_s                          wall seconds: warmup, rl, and within RL rollout / train / eval / waiting /
                                  publish / fetch (the last three in disaggregated runs)
"""
from __future__ import annotations

import json

from jaxpod.runtime import procstats, storage
from jaxpod.train import tracker


def read_metrics(run_dir: str) -> list[dict]:
  """The records of a run's metrics.jsonl, a torn last line skipped (`train.tracker.read_metrics`); [] if there is
  none (a run that has not logged yet)."""
  if not storage.exists(storage.join(run_dir, tracker.METRICS_FILE)):
    return []
  return tracker.read_metrics(run_dir)


def by_step(records: list[dict]) -> list[dict]:
  """One record per step: the trainer logs a step's training metrics and its hooks' results as two lines."""
  merged: dict[int, dict] = {}
  for r in records:
    merged.setdefault(r["step"], {}).update(r)
  return [merged[k] for k in sorted(merged)]


def _series(records: list[dict], key: str, x: str = "step") -> list[list[float]]:
  return [[r.get(x, r["step"]), r[key]] for r in records if key in r]


def collect(folder: str) -> dict:
  """The summary's curves and totals from `<folder>/warmup` and `<folder>/train`."""
  warm, rl = by_step(read_metrics(storage.join(folder, "warmup"))), by_step(read_metrics(storage.join(folder, "train")))
  acc = _series(rl, "eval/accuracy")
  warm_acc = _series(warm, "eval/accuracy")
  # the batch trained at step k was sampled by version k-1 (colocated) or by the versions the queue held
  rewards = [[r.get("rl/behaviour_version", r["step"] - 1), r["reward"]] for r in rl if "reward" in r]
  sums = {k: sum(r.get(f"rl/{k}_s", 0.0) for r in rl) for k in ("rollout", "waiting", "publish", "interval")}
  sums["eval"] = sum(r.get("eval/seconds", 0.0) for r in rl)
  later = [r for r in rl if r["step"] > 0]  # step 0's rollout compiled the engine: left out of the rate
  tokens, rollout_s = sum(r.get("rl/rollout_tokens", 0) for r in later), sum(r.get("rl/rollout_s", 0) for r in later)
  start, end = _start_end(acc)
  out = {"accuracy.start": start, "accuracy.end": end,
         "accuracy": {"start": start, "end": end, "warmup_end": warm_acc[-1][1] if warm_acc else None},
         "reward_curve": rewards, "accuracy_curve": acc, "rollout_tokens": tokens,
         "tokens_per_s": tokens / rollout_s if rollout_s else None, "seconds": sums}
  k = next((int(r["eval/pass_k"]) for r in rl if "eval/pass_k" in r), 0)
  if k:
    samples = next(int(r["eval/pass_samples"]) for r in rl if "eval/pass_samples" in r)
    out["pass_at_k"] = {"k": k, "samples": samples}
    for name in dict.fromkeys((1, k)):
      curve = _series(rl, f"eval/pass_at_{name}")
      first, last = _start_end(curve)
      out["pass_at_k"][f"pass@{name}"] = {"start": first, "end": last, "lift_points": 100 * (last - first),
                                          "curve": curve}
  return out


def _start_end(curve: list[list[float]]) -> tuple[float, float]:
  """The value at step 0 (nan if the start was not evaluated) and the last one."""
  return next((a for s, a in curve if s == 0), float("nan")), curve[-1][1] if curve else float("nan")


def write(topology: str, rows_per_step: int, folder: str, warm, rl, warmup_s: float, wall_s: float,
          workers: dict | None = None) -> dict:
  """Leader: summary.json, the console table and rl.png; returns the summary."""
  out = collect(folder)
  s = out.pop("seconds")
  train_s = max(0.0, s["interval"] - s["eval"] - s["waiting"] - s["publish"])
  out.update({"run_dir": folder, "topology": topology, "rows_per_step": rows_per_step, "steps": rl.final_step,
              "end_reason": rl.end_reason, "resumed": rl.resumed,
              "lift_points": 100 * (out["accuracy.end"] - out["accuracy.start"]),
              "memory": procstats.peak_memory(),  # this trainer process's peak (the engine's too when colocated)
              "time_s": {"total": wall_s, "warmup": warmup_s, "rl": rl.wall_s, "rl_startup": rl.time_to_first_step_s,
                         "rollout": s["rollout"], "train": train_s, "eval": s["eval"], "waiting": s["waiting"],
                         "publish": s["publish"]}})
  if workers:
    out["workers"] = workers
    out["time_s"]["fetch"] = sum(w.get("fetch_s", 0.0) for w in workers.values())
    out["time_s"]["rollout"] = sum(w.get("rollout_s", 0.0) for w in workers.values())
    rate = [w["tokens"] / w["rollout_s"] for w in workers.values() if w.get("rollout_s")]
    out["tokens_per_s"] = sum(rate) if rate else None
  storage.write_text(storage.join(folder, "summary.json"), json.dumps(out, indent=1))
  plot(folder, out)
  _print(out)
  return out


def _print(out: dict) -> None:
  from jaxpod.runtime.console import print_table
  t = out["time_s"]
  rewards = out["reward_curve"]
  rows = [("run folder", out["run_dir"]),
          ("held-out accuracy", f"{out['accuracy.start']:.1%} at the start of RL -> {out['accuracy.end']:.1%} "
                                f"({out['lift_points']:+.1f} points)"),
          ("reward", f"{rewards[0][1]:.3f} -> {rewards[-1][1]:.3f} over {len(rewards)} steps" if rewards else "-"),
          *_pass_rows(out),
          *([("ended early", out["end_reason"])] if out.get("end_reason") else []),
          ("rollout tokens/s", f"{out['tokens_per_s']:.0f}" if out["tokens_per_s"] else "-"),
          ("time", f"{t['total']:.0f} s: warm-up {t['warmup']:.0f} s, RL {t['rl']:.0f} s (rollout "
                   f"{t['rollout']:.0f}, train {t['train']:.0f}, eval {t['eval']:.0f}, waiting {t['waiting']:.0f}, "
                   f"publish {t['publish']:.0f} s)"),
          ("final policy", storage.join(out["run_dir"], "hf"))]
  print_table("jaxpod rl: summary", ("what", "value"), rows, header=False)


def _pass_rows(out: dict) -> list[tuple[str, str]]:
  if "pass_at_k" not in out:
    return []
  p = out["pass_at_k"]
  text = ", ".join(f"{name} {v['start']:.1%} -> {v['end']:.1%} ({v['lift_points']:+.1f} points)"
                   for name, v in p.items() if name.startswith("pass@"))
  return [("held-out pass@k", f"{text} ({p['samples']} samples per problem)")]


def plot(folder: str, out: dict | None = None) -> str:
  """rl.png: mean reward and held-out accuracy per policy version; returns its URL."""
  import io
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  out = out or collect(folder)
  fig, (ax_r, ax_a) = plt.subplots(1, 2, figsize=(10, 3.5))
  if out["reward_curve"]:
    x, y = zip(*out["reward_curve"])
    ax_r.plot(x, y, ".-", lw=1)
  ax_r.set_xlabel("policy version that sampled")
  ax_r.set_ylabel("mean reward")
  ax_r.set_title("reward per policy version")
  curves = {"greedy": out["accuracy_curve"]}
  curves.update({name: v["curve"] for name, v in out.get("pass_at_k", {}).items() if name.startswith("pass@")})
  for label, curve in curves.items():
    if curve:
      x, y = zip(*curve)
      ax_a.plot(x, [100 * v for v in y], "o-", label=label)
  if len(curves) > 1:
    ax_a.legend()
  ax_a.set_xlabel("policy version (GRPO step)")
  ax_a.set_ylabel("held-out correct (%)")
  ax_a.set_ylim(0, 100)
  ax_a.set_title("held-out accuracy")
  for ax in (ax_r, ax_a):
    ax.grid(alpha=0.3)
  fig.tight_layout()
  buf = io.BytesIO()
  fig.savefig(buf, format="png", dpi=100)
  plt.close(fig)
  url = storage.join(folder, "rl.png")
  storage.write_bytes(url, buf.getvalue())
  return url
