"""`jaxpod bench rl --against trl`: jaxpod's colocated loop and TRL's GRPOTrainer on one workload, in one run.

The workload is a prompt file: GSM8K-format word problems (`jaxpod data word-problems`), the
policy a supervised warm-up on their disjoint warm-up set exported as a HF checkpoint with
byte-level tokenizer files (so transformers and TRL load it with jaxpod's ids). From that one
checkpoint, per round (`--repeats`, medians reported): `jaxpod rl --model.hf DIR --task.type
dataset` (colocated) and `python -m jaxpod.bench.rl.trl_side` (TRL, HF generate, torch CPU), each in its
own process, with the same prompts in the same order, reward (GSM8K's verifier), n, prompts per
step, learning rate and schedule, clipping, loss normalisation and temperature (see `trl_side.py`).
DAPO's dynamic sampling is off on jaxpod's side (TRL samples exactly the prompts it trains on).
Figures (steady state, steps 3..): seconds per step and where they go (generation: jaxpod's rollout
engine / TRL's HF `generate`; scoring: TRL's decode + rewards + log-prob pass, inside jaxpod's rollout
figure; train: forward, backward, optimizer), completion tokens per second of step time (TRL
generates inside its step), reward per wall-clock second, held-out greedy accuracy after the steps;
the check is jaxpod's reward/s over TRL's, per workload.

Two workloads (`--workloads`, both by default, alternating within each round):
  long   `long.py`: day-by-day word problems whose worked solutions take 128-512 tokens, a BPE tokenizer and a
         Llama-shaped policy fine-tuned on a flawed teacher (`--long-size small`, the default, or `full`)
  short  the one above: one-step problems, byte-level policy, completions of at most 20 tokens
After them, the GRPO train step alone on each workload's shapes and policy (`step.py`): jaxpod's
forward + backward against torch's.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import statistics
import tempfile

from jaxpod.bench.common import machine, print_table, rl_run_figures, run_jaxpod_rl, run_logged, write_json

WORKLOADS = ("long", "short")
# load average per CPU above which a side's figures are not comparable (torch's OpenMP threads spin-wait for
# descheduled peers: at load 9 on 2 cores a 2-thread HF decode step took 85-440 ms, a 1-thread one 10 ms). The
# bench's own previous side keeps the 1-minute average near 1 per CPU, so the bar sits above that.
QUIET_LOAD = 1.25


@dataclasses.dataclass(frozen=True)
class Shape:
  """What both sides are told of one workload (the same on each)."""

  name: str  # long | short
  prompts: int  # prompts per step
  generations: int  # samples per prompt
  lr: float  # learning rate
  max_prompt_len: int  # prompt tokens
  max_new_tokens: int  # completion tokens at most
  eval_size: int  # held-out problems


SHORT = Shape("short", 16, 8, 3e-4, 56, 20, 128)


def _workload(shape: Shape) -> list[str]:
  return ["--task.type", "dataset", "--task.prompt_column", "question", "--task.verifier", "gsm8k",
          "--rewards", "[gsm8k]", "--task.eval_size", str(shape.eval_size), "--rollout.max_prompt_len",
          str(shape.max_prompt_len), "--rollout.max_new_tokens", str(shape.max_new_tokens), "--rollout.temperature",
          "1.0", "--rollout.groups_per_file", str(min(8, shape.prompts)), "--trainer.progress", "false"]


def long_shape(size: str) -> Shape:
  """The long workload's shape at `size` (`long.SIZES`)."""
  from jaxpod.bench.rl.long import SIZES
  w = SIZES[size]
  return Shape("long", w.prompts, w.generations, w.lr, w.max_prompt_len, w.max_new_tokens, 32)


def _policy(root: str, warmup_steps: int) -> tuple[str, str]:
  """(HF checkpoint of the short workload's warm-up, problems.jsonl) under root."""
  from jaxpod.data.word_problems import WordProblemConfig, build
  from jaxpod.models.llama.tokenizer import save_byte_tokenizer
  data, runs = os.path.join(root, "data"), os.path.join(root, "runs")
  build(WordProblemConfig(out=data))
  run_jaxpod_rl([*_workload(SHORT), "--task.path", os.path.join(data, "sft.jsonl"), "--model.max_position_embeddings",
                 "96", "--warmup.steps", str(warmup_steps), "--warmup.batch_size", "64", "--warmup.lr", "3e-3",
                 "--trainer.steps", "1", "--grpo.num_prompts_per_step", "8", "--grpo.sample_prompts_per_step", "0",
                 "--grpo.filter_groups", "false", "--trainer.runs_dir", runs,
                 "--trainer.run_name", "warm", "--export_hf", "false"], os.path.join(root, "warm.log"))
  policy = os.path.join(root, "policy")
  shutil.copytree(os.path.join(runs, "warm", "warmup", "hf"), policy)
  save_byte_tokenizer(policy)
  return policy, os.path.join(data, "problems.jsonl")


def _jaxpod(root: str, policy: str, problems: str, steps: int, name: str, shape: Shape = SHORT) -> dict:
  load = os.getloadavg()[0]
  runs = os.path.join(root, "runs")
  wall = run_jaxpod_rl(["--model.hf", policy, *_workload(shape), "--task.path", problems, "--trainer.steps", str(steps),
                        "--trainer.eval_every", str(steps), "--trainer.checkpoint_every", "0", "--export_hf", "false",
                        "--grpo.num_prompts_per_step", str(shape.prompts), "--grpo.num_generations",
                        str(shape.generations), "--grpo.lr", str(shape.lr), "--grpo.sample_prompts_per_step", "0",
                        "--grpo.filter_groups", "false", "--trainer.runs_dir", runs, "--trainer.run_name", name,
                        # as many decode slots as the step's samples, as TRL generates them: the slots engine's
                        # decode computes every slot, so rl's default 128 made a 32-sample step decode 4x the rows
                        "--rollout.batch_size", str(shape.prompts * shape.generations)],
                       os.path.join(root, f"{name}.log"))
  m = rl_run_figures(os.path.join(runs, name))
  from jaxpod.rl.summary import by_step, read_metrics
  later = [r for r in by_step(read_metrics(os.path.join(runs, name, "train"))) if r["step"] >= 2 and "reward" in r]
  tokens = sum(r["completion_tokens"] for r in later) / len(later)  # per step, as TRL's figure (generation in its step)
  return {"seconds_per_step": m["step_s"], "generate_s": m["rollout_s"], "score_s": 0.0, "train_s": m["train_s"],
          "tokens_per_s": tokens / m["step_s"], "reward_per_s": m["reward_per_s"],
          "accuracy_start": m["accuracy_start"], "accuracy_end": m["accuracy_end"], "wall_s": wall, "load_start": load}


def _trl(root: str, policy: str, problems: str, steps: int, name: str, shape: Shape = SHORT) -> dict:
  load = os.getloadavg()[0]
  out = os.path.join(root, f"{name}.json")
  args = ["--model", policy, "--prompts", problems, "--prompt_column", "question", "--verifier", "gsm8k",
          "--eval_size", str(shape.eval_size), "--steps", str(steps), "--num_prompts_per_step", str(shape.prompts),
          "--num_generations", str(shape.generations), "--lr", str(shape.lr), "--temperature", "1.0",
          "--max_new_tokens", str(shape.max_new_tokens), "--out", out]
  run_logged(["jaxpod.bench.rl.trl_side", *args], os.path.join(root, f"{name}.log"),
             "bench rl --against trl: TRL's run")
  return json.loads(open(out).read()) | {"load_start": load}


def side_order(round_index: int) -> tuple[str, str]:
  """Who runs first in a round: jaxpod in even rounds, TRL in odd ones, so neither side always follows the other
  (the one that runs second starts at the first one's load and in its page cache)."""
  return ("jaxpod", "trl") if round_index % 2 == 0 else ("trl", "jaxpod")


def run(steps: int, warmup_steps: int, repeats: int, json_path: str | None, policy: str = "",
        problems: str = "", profile: bool = False, workloads: tuple[str, ...] = WORKLOADS,
        long_size: str = "small") -> dict:
  """Warm-up once per workload (the short one's unless `policy` and its `problems` are given), then jaxpod and TRL
  `repeats` times, alternating sides and workloads; tables + JSON."""
  from jaxpod.runtime.extras import require
  for module in ("trl", "torch", "datasets", "math_verify"):  # before the warm-up, not after it
    require(module, "`jaxpod bench rl --against trl`")
  root = tempfile.mkdtemp(prefix="jaxpod-bench-rl-trl-")
  setups: dict[str, tuple[Shape, str, str]] = {}
  for workload in workloads:
    folder = os.path.join(root, workload)
    os.makedirs(folder)
    if workload == "short":
      if not policy:
        print(f"bench rl --against trl: short warm-up ({warmup_steps} steps) in {folder}", flush=True)
      setups["short"] = (SHORT, *((policy, problems) if policy else _policy(folder, warmup_steps)))
    else:
      from jaxpod.bench.rl.long import SIZES, warm_policy
      print(f"bench rl --against trl: long ({long_size}) warm-up in {folder}", flush=True)
      setups["long"] = (long_shape(long_size), *warm_policy(folder, SIZES[long_size]))
  runs: dict[str, dict[str, list[dict]]] = {w: {"jaxpod": [], "trl": []} for w in setups}
  sides = {"jaxpod": _jaxpod, "trl": _trl}
  for r in range(repeats):
    for workload, (shape, pol, probs) in setups.items():
      folder = os.path.join(root, workload)
      for side in side_order(r):
        runs[workload][side].append(sides[side](folder, pol, probs, steps, f"{side}-{r}", shape))
      print(f"bench rl --against trl: {workload} round {r} done", flush=True)
  payload = {w: report(runs[w], steps, warmup_steps, repeats, os.path.join(root, w), None, setups[w][0])
             for w in setups}
  from jaxpod.bench.rl.step import StepShapes, run as step_table
  for workload, (shape, pol, _) in setups.items():
    payload[workload]["train_step"] = step_table(
        pol, StepShapes(shape.prompts * shape.generations, shape.max_prompt_len + shape.max_new_tokens,
                        shape.max_new_tokens), repeats=repeats, with_profile=profile, title=f" ({workload} workload)")
  payload = {"benchmark": "rl-vs-trl", "workloads": payload, "long_size": long_size, "folder": root,
             "machine": machine(), "load_average": os.getloadavg()[0]}
  write_json(json_path, payload)
  return payload


def report(runs: dict[str, list[dict]], steps: int, warmup_steps: int, repeats: int, root: str,
           json_path: str | None, shape: Shape = SHORT) -> dict:
  """Medians over the rounds, the table and the JSON."""
  keys = ("seconds_per_step", "generate_s", "score_s", "train_s", "tokens_per_s", "reward_per_s", "accuracy_end")
  results = {arm: {k: statistics.median(x[k] for x in xs) for k in keys} for arm, xs in runs.items()}
  trl_rate = results["trl"]["reward_per_s"]
  checks = {"jaxpod_over_trl_reward_per_s": results["jaxpod"]["reward_per_s"] / trl_rate if trl_rate else None,
            "trl_over_jaxpod_seconds_per_step": results["trl"]["seconds_per_step"] / results["jaxpod"]["seconds_per_step"]}
  version = runs["trl"][0]["trl_version"]
  start = runs["jaxpod"][0]["accuracy_start"]
  rows = [(arm, f"{r['seconds_per_step']:.2f}", f"{r['generate_s']:.2f}", f"{r['score_s']:.2f}", f"{r['train_s']:.2f}",
           f"{r['tokens_per_s']:.0f}", f"{r['reward_per_s']:.2f}", f"{start:.0%}>{r['accuracy_end']:.0%}")
          for arm, r in results.items()]
  ratio = checks["jaxpod_over_trl_reward_per_s"]
  loads = [x.get("load_start", 0.0) for xs in runs.values() for x in xs]
  quiet = max(loads) <= QUIET_LOAD * (os.cpu_count() or 1)
  if not quiet:
    print(f"bench rl --against trl: NOT QUIET: load average up to {max(loads):.1f} on {os.cpu_count()} CPUs as a side "
          "started; torch's OpenMP threads stall when other jobs hold the cores (at load 9 on 2 cores a 2-thread "
          "HF decode step took 85-440 ms, a 1-thread one 10 ms), so the ratios below are void: rerun with the "
          "machine to itself", flush=True)
  print_table(f"rl vs TRL {version} GRPOTrainer, {shape.name} workload (completions <= {shape.max_new_tokens} tokens): "
              f"{steps} steps x {shape.prompts} prompts x {shape.generations} samples from one "
              f"warm-up, medians of {repeats}; jaxpod / TRL reward per second = "
              + (f"{ratio:.2f}" if ratio is not None else "- (TRL earned no reward)"),
              ["arm", "s/step", "generate", "score", "train", "tok/s of step", "reward/s", "held-out acc"], rows)
  payload = {"benchmark": "rl-vs-trl", "workload": dataclasses.asdict(shape), "baseline": "trl",
             "trl_version": version, "steps": steps,
             "warmup_steps": warmup_steps, "repeats": repeats, "results": results, "checks": checks, "runs": runs,
             "quiet": quiet,
             "folder": root, "machine": machine(), "load_average": os.getloadavg()[0]}
  write_json(json_path, payload)
  return payload
