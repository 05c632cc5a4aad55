"""`jaxpod bench rl --episodes true`: seconds per GRPO step on multi-turn episodes, the KV kept across turns or not.

One short supervised warm-up on the calculator's problems (a teacher that always calls the tool) is run and
exported; every arm then runs `jaxpod rl` colocated from that checkpoint (`--model.hf`, so the warm-up is not
timed) for `steps` GRPO steps, once with
`--rollout.keep_kv true` (kept: a turn prefills only the last sampled token and the observation) and once with
`false` (whole: every turn re-prefills the episode's whole context), arms interleaved over `repeats` rounds
(medians reported). Examples (`EXAMPLES`):

  calculator  `--task.type calculator`: its tool, at most 3 turns (a tool call, the tool's `= value`, the answer)
  synthetic   the calculator's problems with `bench.common.Synthetic`: a 16-token observation after every
              turn, never done, so every episode runs its 6 turns (reward always 0: `--grpo.filter_groups false`)
  synthetic24 the same for 24 turns (contexts up to ~770 tokens), an agent's trajectory of many short tool calls:
              re-prefilling grows with turns squared, the train step and decoding with turns

Every arm samples `num_prompts_per_step` problems per step (filter_groups off: one sampling round a step, the same
work whatever the rewards). Per arm, per step (steady state, `common.rl_run_figures`): the RL step (sampling + the
GRPO train step, as the colocated loop runs them), sampling, train; prefill tokens per episode (real:
`rl/prefill_tokens` / `rl/samples`) and over the episode's distinct tokens (`rl/context_tokens`: prompt + every
token after it). Both arms draw the same episodes (same seeds, same tokens: `same` compares the sampled tokens
of every step; on 24-turn episodes a kept and a recomputed context's fp32 rounding can flip a rare draw, so it says
how many differ). Speed-ups are whole / kept seconds; nothing asserts on time.
"""
from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile

from jaxpod.bench.common import machine, print_table, rl_run_figures, run_jaxpod_rl, write_json

SYNTHETIC = "jaxpod.bench.common:Synthetic"
EXAMPLES = {"calculator": ("--rollout.max_prompt_len", "48"),  # the calculator's own config: 3 turns at most
            "synthetic": ("--task.environment_name", SYNTHETIC, "--task.max_turns", "6",  # 6 turns of <= 16 tokens:
                          "--rollout.max_prompt_len", "184"),  # 20 + 5 x (16 + a 16-token observation) = 180 fit
            "synthetic24": ("--task.environment_name", SYNTHETIC, "--task.max_turns", "24",
                            "--rollout.max_prompt_len", "760")}  # 20 + 23 x 32 = 756 fit
SHAPES = ("--grpo.num_prompts_per_step", "8", "--grpo.sample_prompts_per_step", "8", "--grpo.num_generations", "4",
          "--grpo.filter_groups", "false", "--rollout.max_new_tokens", "16", "--rollout.batch_size", "32",
          "--rollout.eval_slots", "32", "--task.eval_size", "16", "--eval.k", "0")
MODES = {"kept": "true", "whole": "false"}


@dataclasses.dataclass(frozen=True)
class EpisodesBench:
  """What one run of the episodes bench does."""

  steps: int = 8  # GRPO steps per arm (steps 2.. measured)
  warmup_steps: int = 30  # supervised steps of the shared warm-up
  repeats: int = 3  # rounds over the arms (interleaved); medians reported
  examples: tuple[str, ...] = tuple(EXAMPLES)  # which examples
  shapes: tuple[str, ...] = SHAPES  # `jaxpod rl` options of every arm (and the warm-up)
  policy: str = ""  # start every arm from this HF checkpoint instead of a warm-up (a smoke test's random policy)


def _arm_args(opts: EpisodesBench, example: str, mode: str, warm: str, runs: str, name: str) -> list[str]:
  return ["--task.type", "calculator", "--model.hf", warm, "--rollout.keep_kv", MODES[mode],
          "--trainer.steps", str(opts.steps), "--trainer.eval_every", str(opts.steps), "--trainer.runs_dir", runs,
          "--trainer.run_name", name, "--trainer.checkpoint_every", "0", "--trainer.progress", "false",
          "--export_hf", "false", *EXAMPLES[example], *opts.shapes]  # shapes last: they may shrink an example


def _episode_figures(folder: str) -> dict:
  """Prefill and distinct tokens per episode over the measured steps, and the sampled tokens of every step."""
  from jaxpod.rl.summary import by_step, read_metrics
  records = [r for r in by_step(read_metrics(os.path.join(folder, "train"))) if "rl/samples" in r]
  measured = [r for r in records if r["step"] >= 2]
  samples = sum(r["rl/samples"] for r in measured)
  prefill, distinct = (sum(r[k] for r in measured) / samples for k in ("rl/prefill_tokens", "rl/context_tokens"))
  return {"prefill_per_episode": prefill, "distinct_per_episode": distinct, "prefill_over_distinct": prefill / distinct,
          "sampled_tokens": [r["rl/rollout_tokens"] for r in records]}


def run(json_path: str | None = None, **overrides) -> dict:
  """Warm-up once (unless `policy`), then every example's kept and whole arms `repeats` times, interleaved."""
  opts = dataclasses.replace(EpisodesBench(), **overrides)
  bad = [e for e in opts.examples if e not in EXAMPLES]
  if bad or not opts.examples or opts.steps < 3:
    raise ValueError(f"bench rl --episodes: examples {list(opts.examples)} (some of {list(EXAMPLES)}), "
                     f"--steps {opts.steps} (>= 3: steps 2.. are measured)")
  root = tempfile.mkdtemp(prefix="jaxpod-bench-rl-episodes-")
  runs = os.path.join(root, "runs")
  load = [os.getloadavg()[0]]
  warm = opts.policy
  if not warm:
    print(f"bench rl --episodes: warm-up ({opts.warmup_steps} steps) in {root}", flush=True)
    run_jaxpod_rl(["--task.type", "calculator", "--model.max_position_embeddings", "1024", "--task.teacher_skip_tool",
                   "0", "--warmup.steps",  # a teacher that always calls the tool: the calculator's episodes are 2 turns
                   str(opts.warmup_steps), "--trainer.steps", "2", "--trainer.runs_dir", runs, "--trainer.run_name",
                   "warm", "--trainer.progress", "false", "--export_hf", "false", *opts.shapes],
                  os.path.join(root, "warm.log"))
    warm = os.path.join(runs, "warm", "warmup", "hf")
  arms = [(e, m) for e in opts.examples for m in MODES]
  by_arm: dict[str, list[dict]] = {f"{e}:{m}": [] for e, m in arms}
  for r in range(opts.repeats):
    for example, mode in arms[r % len(arms):] + arms[:r % len(arms)]:  # the order rotates: no arm always first
      name = f"{example}-{mode}-{r}"
      wall = run_jaxpod_rl(_arm_args(opts, example, mode, warm, runs, name), os.path.join(root, f"{name}.log"))
      folder = os.path.join(runs, name)
      by_arm[f"{example}:{mode}"].append({k: v for k, v in rl_run_figures(folder).items()
                                          if k in ("step_s", "rollout_s", "train_s")}
                                         | _episode_figures(folder) | {"wall_s": wall})
      print(f"bench rl --episodes: {name} done in {wall:.0f} s", flush=True)
      load.append(os.getloadavg()[0])
  results = {a: {k: statistics.median(x[k] for x in rs) for k in rs[0] if k != "sampled_tokens"}
             for a, rs in by_arm.items()}
  checks = {}
  for e in opts.examples:
    kept, whole = results[f"{e}:kept"], results[f"{e}:whole"]
    pairs = [(a, b) for k, w in zip(by_arm[f"{e}:kept"], by_arm[f"{e}:whole"])
             for a, b in zip(k["sampled_tokens"], w["sampled_tokens"])]
    checks[e] = {"step_speedup": whole["step_s"] / kept["step_s"],
                 "sampling_speedup": whole["rollout_s"] / kept["rollout_s"],
                 "kept_prefill_over_distinct": kept["prefill_over_distinct"],
                 "same_episodes": all(a == b for a, b in pairs),
                 # sampled tokens per step compared: a kept and a recomputed context differ in fp32 rounding, which
                 # can flip a rare draw on long episodes (invariant 9: the same tokens up to that rounding)
                 "tokens_differing": sum(abs(a - b) for a, b in pairs), "tokens_sampled": sum(b for _, b in pairs)}
  payload = {"benchmark": "rl-episodes", "baseline": "whole", "options": dataclasses.asdict(opts),
             "results": results, "checks": checks, "runs": by_arm, "folder": root, "machine": machine(),
             "load_average": {"start": load[0], "max": max(load), "end": load[-1]}}
  _table(opts, results, checks, payload["load_average"])
  write_json(json_path, payload)
  return payload


def _table(opts: EpisodesBench, results: dict, checks: dict, load: dict) -> None:
  rows = []
  for e in opts.examples:
    for mode in MODES:
      r, c = results[f"{e}:{mode}"], checks[e]
      kept = mode == "kept"
      rows.append((e, mode, f"{1e3 * r['step_s']:.0f}", f"{1e3 * r['rollout_s']:.0f}", f"{1e3 * r['train_s']:.0f}",
                   f"{r['prefill_per_episode']:.0f}", f"{r['distinct_per_episode']:.0f}",
                   f"{r['prefill_over_distinct']:.2f}", f"{c['step_speedup']:.2f}x" if kept else "-",
                   f"{c['sampling_speedup']:.2f}x" if kept else "-",
                   _same(c) if kept else "-"))
  print_table(f"rl episodes: KV kept across turns vs every turn re-prefilled (whole); ms per GRPO step (sampling + "
              f"train, steady state), medians of {opts.repeats} interleaved runs of {opts.steps} steps; prefill and "
              f"distinct tokens per episode; speed-up = whole / kept; load {load['start']:.1f}..{load['max']:.1f}",
              ["example", "KV", "step", "sampling", "train", "prefill", "distinct", "/ distinct", "step x",
               "sampling x", "same"], rows)


def _same(check: dict) -> str:
  """'yes', or how many of the sampled tokens per step differ between the arms."""
  if check["same_episodes"]:
    return "yes"
  return f"{check['tokens_differing']:.0f} of {check['tokens_sampled']:.0f}"
