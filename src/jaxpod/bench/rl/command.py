"""`jaxpod bench rl`: RL post-training per topology and weight-update mode, from one warm-up, in one run.

One supervised warm-up is run first and exported; every arm then runs `jaxpod rl` from that
checkpoint (`--model.hf`) for `--steps` GRPO steps in its own process(es), arms interleaved over
`--repeats` rounds (medians reported):

  colocated   one process: engine and trainer alternate on the same devices, weights in memory
  inflight    disaggregated: a trainer job and a rollout-worker job (each launched as its own
              cluster), weights through `--transfer-mode`, workers swap weights between decode steps
  drain       the same, but workers finish the sequences in flight before swapping (drain-and-sync)

With `--lora-rank R` every arm runs twice from the same warm-up, full fine-tuning and `<arm>+lora`
(`jaxpod rl --lora.rank R`: adapters trained and published alone), interleaved; the table adds kB per
published version, the trainer process's peak resident memory (VmHWM from /proc/self/status at the end of
its run, in its summary.json; on an accelerator also the devices' `peak_bytes_in_use`) and the bytes of the
trained part of its train state (params + Adam state, from shapes: `bench.rl.lora.train_state_bytes`).
Both disaggregated arms run with the same `max_policy_lag`. Per arm, per GRPO step (seconds): rollout
(the engine), train (the trainer's step and its hooks), publish (trainer), fetch (worker, per step),
waiting (trainer idle for rollouts); sampled tokens/s; reward per wall-clock second (the rewards of
every sample trained on, summed, over the RL wall time) and held-out accuracy at the end. Checks
printed with the table: publish + fetch as a share of a trainer step (disaggregated), and in-flight
reward/s over drain-and-sync reward/s. On this 2-core machine every arm shares the same two cores:
the disaggregated jobs do not get more hardware, they compete for it.
"""
from __future__ import annotations

import dataclasses
import json
import os
import statistics
import tempfile

from jaxpod.bench.common import machine, print_table, rl_run_figures, run_jaxpod_rl, write_json

ARMS = ("colocated", "inflight", "drain")


@dataclasses.dataclass(frozen=True)
class RLBench:
  """Options of `jaxpod bench rl`."""

  steps: int = 20  # GRPO steps per arm
  warmup_steps: int = 150  # supervised steps of the shared warm-up
  repeats: int = 1  # rounds over the arms (interleaved); medians reported
  arms: tuple[str, ...] = ARMS  # which arms to run
  max_policy_lag: int = 2  # the same for every arm
  transfer_mode: str = "checkpoint"  # weight transport of the disaggregated arms (checkpoint | arrow_flight)
  # more `jaxpod rl` options for every arm; the default workload sorts 2..12 digits: completions of varied
  # length, where a drain waits for the longest sequence in flight (rollout lengths in RL vary like this)
  extra: tuple[str, ...] = ("--task.min_length", "2", "--task.length", "12", "--rollout.max_prompt_len", "24",
                            "--rollout.max_new_tokens", "16")
  lora_rank: int = 0  # > 0: every arm runs twice from the same warm-up, full fine-tuning and `<arm>+lora` at this rank
  json: str | None = None  # write the results here
  against: str = ""  # trl: jaxpod's colocated loop vs TRL's GRPOTrainer on a prompt file instead (against_trl.py)
  policy: str = ""  # --against trl: start from this HF checkpoint (tokenizer files included) instead of a warm-up
  prompts: str = ""  # --against trl with --policy: its word-problem file (`jaxpod data word-problems`' problems.jsonl)
  workloads: tuple[str, ...] = ("long", "short")  # --against trl: which workloads (against_trl.py), alternating
  long_size: str = "small"  # --against trl: the long workload's size: small (minutes per repeat) | full (~19M params)
  step: bool = False  # only the GRPO train-step table (jaxpod's log-prob paths, torch's fwd+bwd; step.py)
  profile: bool = False  # the train-step table adds its op-level profile (categories and the costliest XLA ops)
  episodes: bool = False  # only multi-turn episodes' RL step, KV kept vs re-prefilled (episodes.py; --steps etc.)

  def __post_init__(self):
    if self.steps < 2 or self.warmup_steps < 1 or self.repeats < 1:
      raise ValueError("--steps must be >= 2, --warmup-steps and --repeats >= 1")
    if self.against not in ("", "trl"):
      raise ValueError(f"--against {self.against!r}: the one peer is trl")
    if bool(self.policy) != bool(self.prompts):
      raise ValueError("--policy and --prompts go together (a checkpoint and the problems.jsonl it is trained on)")
    if self.long_size not in ("small", "full") or not set(self.workloads) <= {"long", "short"} or not self.workloads:
      raise ValueError(f"--long-size {self.long_size!r} (small | full), --workloads {list(self.workloads)} "
                       "(some of long, short)")
    bad = [a for a in self.arms if a not in ARMS]
    if bad or not self.arms:
      raise ValueError(f"--arms {list(self.arms)}: use some of {ARMS}")


def _arm_args(arm: str, opts: RLBench, warm: str, runs: str, name: str) -> list[str]:
  args = ["--model.hf", warm, "--trainer.steps", str(opts.steps), "--trainer.runs_dir", runs,
          "--trainer.run_name", name, "--trainer.eval_every", str(opts.steps), "--trainer.checkpoint_every", "0",
          "--trainer.progress", "false", "--grpo.max_policy_lag", str(opts.max_policy_lag), "--export_hf", "false",
          *opts.extra]
  if arm != "colocated":
    args += ["--topology", "disaggregated", "--rollout.update", arm, "--transfer.mode", opts.transfer_mode]
  return args


def run(json_path: str | None = None, **overrides) -> dict:
  """Warm-up once, then every arm `repeats` times (interleaved); table + JSON."""
  opts = dataclasses.replace(RLBench(json=json_path), **overrides)
  root = tempfile.mkdtemp(prefix="jaxpod-bench-rl-")
  runs = os.path.join(root, "runs")
  print(f"bench rl: warm-up ({opts.warmup_steps} steps) in {root}", flush=True)
  run_jaxpod_rl(["--warmup.steps", str(opts.warmup_steps), "--trainer.steps", "2", "--trainer.runs_dir", runs,
                 "--trainer.run_name", "warm", "--trainer.progress", "false", "--export_hf", "false", *opts.extra],
                os.path.join(root, "warm.log"))
  warm = os.path.join(runs, "warm", "warmup", "hf")
  variants = [("", [])] + ([("+lora", ["--lora.rank", str(opts.lora_rank)])] if opts.lora_rank else [])
  by_arm = {a + v: [] for a in opts.arms for v, _ in variants}
  state = {}  # variant -> bytes of its train state's trained part (the same for every arm)
  if opts.lora_rank:
    from jaxpod.bench.rl.lora import train_state_bytes
    state = {v: {"state_bytes": train_state_bytes(_arm_args("colocated", opts, warm, runs, "state") + more)["trained"]}
             for v, more in variants}
  for r in range(opts.repeats):
    for arm in opts.arms:
      for variant, more in variants:  # full fine-tuning and LoRA side by side, interleaved
        name = f"{arm}{variant.replace('+', '-')}-{r}"
        wall = run_jaxpod_rl(_arm_args(arm, opts, warm, runs, name) + more, os.path.join(root, f"{name}.log"))
        by_arm[arm + variant].append(rl_run_figures(os.path.join(runs, name)) | {"wall_s": wall}
                                     | _extra_figures(os.path.join(runs, name)) | state.get(variant, {}))
        print(f"bench rl: {name} done in {wall:.0f} s", flush=True)
  results = {a: {k: (statistics.median(v[k] for v in runs_) if all(v[k] is not None for v in runs_) else None)
                 for k in runs_[0]} for a, runs_ in by_arm.items()}  # medians over the repeats
  checks = {}
  if "inflight" in results and "drain" in results:
    drain = results["drain"]["reward_per_s"]
    checks["inflight_over_drain_reward_per_s"] = results["inflight"]["reward_per_s"] / drain if drain else None
  for a in ("inflight", "drain"):
    if a in results:
      checks[f"{a}_publish_fetch_over_train_step"] = results[a]["publish_fetch_over_train"]
  payload = {"benchmark": "rl", "baseline": "colocated", "options": dataclasses.asdict(opts), "results": results,
             "checks": checks, "runs": by_arm, "folder": root, "machine": machine(),
             "load_average": os.getloadavg()[0]}
  _table(opts, results, checks)
  payload["train_step"] = train_step(opts, os.path.join(runs, "warm", "warmup", "hf"))
  write_json(json_path, payload)
  return payload


def _flag(extra: tuple[str, ...], name: str, default: int) -> int:
  return int(extra[extra.index(name) + 1]) if name in extra else default


def train_step(opts: RLBench, policy: str | None = None) -> dict:
  """The train-step table (`step.py`) on the arms' shapes: the warm-up's checkpoint, or a random policy."""
  from jaxpod.bench.rl import step as rl_step
  from jaxpod.policy.spec import PolicyModelConfig
  from jaxpod.rl.config import GRPOConfig, RolloutConfig
  g, r = GRPOConfig(), RolloutConfig()
  completion = _flag(opts.extra, "--rollout.max_new_tokens", r.max_new_tokens)
  shapes = rl_step.StepShapes(rows=_flag(opts.extra, "--grpo.num_prompts_per_step", g.num_prompts_per_step)
                              * _flag(opts.extra, "--grpo.num_generations", g.num_generations),
                              row_len=_flag(opts.extra, "--rollout.max_prompt_len", r.max_prompt_len) + completion,
                              completion=completion)
  if policy is None:
    policy = rl_step.save_policy(PolicyModelConfig().llama(), tempfile.mkdtemp(prefix="jaxpod-bench-rl-"))
  return rl_step.run(policy, shapes, repeats=opts.repeats, with_profile=opts.profile, title=" (bench rl's arms)")


def _extra_figures(folder: str) -> dict:
  """Bytes per published version (median; disaggregated arms, 0 colocated: weights stay in memory)."""
  from jaxpod.rl.summary import read_metrics
  rows = read_metrics(os.path.join(folder, "train"))
  sent = [r["rl/publish_bytes"] for r in rows if "rl/publish_bytes" in r]
  memory = json.loads(open(os.path.join(folder, "summary.json")).read()).get("memory") or {}
  return {"publish_bytes": statistics.median(sent) if sent else 0.0,
          "peak_rss_bytes": memory.get("host_peak_rss_bytes"), "device_peak_bytes": memory.get("device_peak_bytes")}


def _table(opts: RLBench, results: dict, checks: dict) -> None:
  ms = lambda x: "(w)" if x is None else f"{1e3 * x:.0f}"  # noqa: E731 - (w): on the workers, beside the trainer
  rows = [(arm, ms(r["step_s"]), ms(r["rollout_s"]), ms(r["train_s"]), ms(r["publish_s"]), ms(r["fetch_s"]),
           ms(r["waiting_s"]), f"{r['tokens_per_s'] or 0:.0f}", f"{r['reward_per_s']:.1f}",
           f"{r['accuracy_start']:.0%}>{r['accuracy_end']:.0%}", f"{r['publish_bytes'] / 1e3:.1f}")
          + ((_mb(r.get("peak_rss_bytes")), _mb(r.get("device_peak_bytes")), _mb(r.get("state_bytes")))
             if opts.lora_rank else ())
          for arm, r in results.items()]
  notes = []
  if checks.get("inflight_over_drain_reward_per_s") is not None:
    notes.append(f"in-flight / drain-and-sync reward per second = {checks['inflight_over_drain_reward_per_s']:.2f}")
  for a in ("inflight", "drain"):
    v = checks.get(f"{a}_publish_fetch_over_train_step")
    if v is not None:
      notes.append(f"{a}: publish + fetch = {v:.1%} of a train step")
  print_table(f"rl: {opts.steps} GRPO steps per arm from one warm-up (ms per step, steady state), medians of "
              f"{opts.repeats}, max_policy_lag {opts.max_policy_lag}, transfer {opts.transfer_mode}; "
              + "; ".join(notes),
              ["arm", "step", "roll", "train", "pub", "fetch", "wait", "tok/s", "rew/s", "acc", "kB/ver"]
              + (["peak MB", "dev MB", "state MB"] if opts.lora_rank else []), rows)


def _mb(x) -> str:
  """Bytes as MB (10^6), '-' when not measured (device peaks on CPU)."""
  return "-" if x is None else f"{x / 1e6:.0f}" if x >= 1e8 else f"{x / 1e6:.2f}"


def cli(opts: RLBench) -> int:
  """Entry of `jaxpod bench rl`."""
  if opts.step:
    write_json(opts.json, {"benchmark": "rl-train-step", "machine": machine(), "train_step": train_step(opts)})
    return 0
  if opts.episodes:
    from jaxpod.bench.rl.episodes import run as episodes
    episodes(opts.json, steps=opts.steps, warmup_steps=opts.warmup_steps, repeats=opts.repeats)
    return 0
  if opts.against == "trl":
    from jaxpod.bench.rl.against_trl import run as against_trl
    against_trl(opts.steps, opts.warmup_steps, opts.repeats, opts.json, opts.policy, opts.prompts, opts.profile,
                tuple(opts.workloads), opts.long_size)
    return 0
  kwargs = {k: v for k, v in dataclasses.asdict(opts).items() if k != "json"}
  kwargs["arms"], kwargs["extra"] = tuple(opts.arms), tuple(opts.extra)
  run(json_path=opts.json, **kwargs)
  return 0
