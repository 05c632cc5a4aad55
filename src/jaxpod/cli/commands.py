"""The command table: every `jaxpod` command and benchmark, registered once.

Each entry names its options dataclass, its help line and its run function as
"module:name" strings, imported only when that command runs (so `jaxpod launch` does not
import the trainer). `jaxpod.cli.main` reads this table for help, parsing, exit codes,
one-line errors and the `--hosts N` relaunch; a new command is one entry here.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Command:
  """One command: options, help line, run function."""

  help: str  # one line, shown by `jaxpod --help` and the group's usage
  run: str  # "module:function(options) -> exit code"; (argv, prog) instead when config is None
  config: str | None = None  # "module:Class" of the frozen options dataclass; None: the run parses its own argv
  load: str | None = None  # "module:function(argv) -> options" used instead of parsing `config` directly
  positional: str | None = None  # field that a leading bare argument fills (`jaxpod plot RUN_DIR`)
  relaunch: bool = False  # options.hosts > 1 outside `jaxpod launch`: rerun this command as that many hosts


@dataclasses.dataclass(frozen=True)
class Group:
  """A command with subcommands (`jaxpod bench NAME`); `default` runs when no subcommand is named."""

  help: str  # one line, shown by `jaxpod --help`
  commands: dict[str, Command]  # subcommand name -> command
  default: Command | None = None  # `jaxpod extract --hf ...` runs this; None: print the subcommands


BENCHES = {
    "barrier": Command("jaxpod barrier vs the raw coordination-service barrier vs a device collective",
                       "jaxpod.bench.barrier.command:cli", "jaxpod.bench.barrier.command:BarrierBench", relaunch=True),
    "trm-step": Command("TRM train-step throughput against this machine's fp32 matmul ceiling",
                        "jaxpod.bench.trm.step:cli", "jaxpod.bench.trm.step:TRMStepBench"),
    "trm-parity": Command("TRM convergence vs the reference PyTorch TRM: same data and batches, N seeds, one PNG",
                          "jaxpod.bench.trm.parity:cli", "jaxpod.bench.trm.parity:TRMParityBench"),
    "sample": Command("jaxpod's sampler vs HF generate; --hosts N: global vs replicated mode",
                      "jaxpod.bench.sample.command:cli", "jaxpod.bench.sample.command:SampleBench", relaunch=True),
    "extract": Command("extraction tokens/s vs transformers output_hidden_states",
                       "jaxpod.bench.extract.command:cli", "jaxpod.bench.extract.command:BenchConfig", relaunch=True),
    "checkpoint": Command("loop cost of one checkpoint (Orbax commit vs the old CRC manifest) per step time",
                          "jaxpod.bench.checkpoint.command:cli", "jaxpod.bench.checkpoint.command:CheckpointBench"),
    "transfer": Command("weight transfer per mode (checkpoint, ray, jax_transfer, arrow_flight)",
                        "jaxpod.bench.transfer.command:cli", "jaxpod.bench.transfer.command:TransferBench"),
    "preference": Command("preference training (DPO, SimPO) tokens/s and peak memory vs TRL's trainers, same model and pairs",
                          "jaxpod.bench.preference.command:cli", "jaxpod.bench.preference.command:PreferenceBench"),
    "rl": Command("RL post-training per topology and weight-update mode (colocated, in-flight, drain-and-sync)",
                  "jaxpod.bench.rl.command:cli", "jaxpod.bench.rl.command:RLBench"),
    "scale": Command("per-host bytes and peak memory of load, train step, publish, export on simulated hosts "
                     "(invariant 10), beside jaxpod plan's prediction",
                     "jaxpod.bench.scale.command:cli", "jaxpod.bench.scale.command:ScaleBench"),
}

COMMANDS: dict[str, Command | Group] = {
    "launch": Command("run a command as N simulated hosts on this machine: jaxpod launch --hosts 2 -- CMD ...",
                      "jaxpod.cli.commands:launch"),
    "doctor": Command("check hosts, devices, mesh, collectives, barriers, cache",
                      "jaxpod.cli.commands:doctor", "jaxpod.runtime.doctor:DoctorConfig"),
    "cache": Group("persistent compile cache: info | clear", {
        "info": Command("files and bytes in the compile cache", "jaxpod.cli.commands:cache_info",
                        "jaxpod.cli.commands:CacheOptions"),
        "clear": Command("remove the compile cache's files", "jaxpod.cli.commands:cache_clear",
                         "jaxpod.cli.commands:CacheOptions"),
    }),
    "sample": Command("generate text from a HF Llama checkpoint on every host",
                      "jaxpod.cli.commands:sample", "jaxpod.sample.config:SampleConfig"),
    "extract": Group("layer activations over a prompt set, per host; extract info URL; extract export URL", {
        "info": Command("summary and completeness of an activation dataset: jaxpod extract info URL",
                        "jaxpod.cli.extract:info", "jaxpod.cli.extract:InfoOptions", positional="url"),
        "export": Command("an activation dataset as Arrow files HF datasets loads: jaxpod extract export URL "
                          "--out DIR", "jaxpod.cli.extract:export", "jaxpod.cli.extract:ExportOptions",
                          positional="url"),
    }, default=Command("layer activations over a prompt set, written per host", "jaxpod.cli.extract:run",
                       "jaxpod.extract.config:ExtractConfig")),
    "bench": Group("benchmarks: " + " | ".join(BENCHES), BENCHES),
    "rl": Command("RL post-training (GRPO): a trainer learns from rollouts sampled with its published weights "
                  "(no arguments: sorting with a small Llama, minutes on CPU)", "jaxpod.cli.commands:rl",
                  "jaxpod.rl.config:RLConfig", load="jaxpod.cli.rl:load_config"),
    "train": Command("train a model (no arguments: a small TRM on 4x4 Sudoku, minutes on CPU)",
                     "jaxpod.cli.train:run", "jaxpod.train.config:TrainConfig", load="jaxpod.cli.train:load_config"),
    "plan": Command("per-host and per-device bytes of each phase of a run on a pod, and what does not fit: "
                    "jaxpod plan --model llama-3-70b --pod v5p-64", "jaxpod.plan.report:cli",
                    "jaxpod.plan.report:PlanOptions"),
    "plot": Command("plot a run's loss and accuracy curves to a PNG: jaxpod plot RUN_DIR",
                    "jaxpod.cli.commands:plot", "jaxpod.train.plot:PlotConfig", positional="run_dir"),
    "checkpoint": Group("checkpoints: verify URL", {
        "verify": Command("read every array of every finished step; exit 1 naming the damaged ones: "
                          "jaxpod checkpoint verify URL", "jaxpod.cli.commands:checkpoint_verify",
                          "jaxpod.cli.commands:VerifyOptions", positional="url"),
    }),
    "data": Group("build datasets (Sudoku; word problems in GSM8K's format)", {
        "sudoku": Command("generate puzzles (any box shape)", "jaxpod.cli.data:sudoku", "jaxpod.cli.data:SudokuArgs"),
        "sudoku-csv": Command("import a Sudoku-Extreme CSV file", "jaxpod.cli.data:sudoku_csv",
                              "jaxpod.cli.data:CsvArgs"),
        "word-problems": Command("write arithmetic word problems in GSM8K's format (RL prompts + a warm-up set)",
                                 "jaxpod.cli.data:word_problems", "jaxpod.data.word_problems:WordProblemConfig"),
    }),
}


# ---------------------------------------------------------------------------- small run functions
@dataclasses.dataclass(frozen=True)
class CacheOptions:
  """Options of `jaxpod cache info|clear`."""

  dir: str | None = None  # cache folder; default: the one `jaxpod train` uses (sibling of runs_dir)
  runs_dir: str = "runs"  # runs folder whose sibling is the default cache


def _cache_path(cfg: CacheOptions) -> str:
  from jaxpod.runtime import compile_cache
  return cfg.dir or compile_cache.default_dir(cfg.runs_dir)


def cache_info(cfg: CacheOptions) -> int:
  from jaxpod.runtime import compile_cache
  i = compile_cache.info(_cache_path(cfg))
  state = "exists" if i["exists"] else "does not exist yet"
  print(f"compile cache {i['dir']} ({state}): {i['entries']} files, {i['bytes'] / 1e6:.1f} MB")
  return 0


def cache_clear(cfg: CacheOptions) -> int:
  from jaxpod.runtime import compile_cache
  path = _cache_path(cfg)
  print(f"removed {compile_cache.clear(path)} files from {path}")
  return 0


@dataclasses.dataclass(frozen=True)
class VerifyOptions:
  """Options of `jaxpod checkpoint verify URL`."""

  url: str = ""  # a checkpoints folder, or a run folder holding checkpoints/ (local path or gs://...)

  def __post_init__(self):
    if not self.url:
      raise ValueError("url is required: jaxpod checkpoint verify URL")


def checkpoint_verify(cfg: VerifyOptions) -> int:
  """`jaxpod checkpoint verify URL`: one line per step, exit 1 if any step is damaged."""
  import sys
  from jaxpod.io import verify
  from jaxpod.runtime import storage
  url = cfg.url
  if storage.exists(storage.join(url, "checkpoints")):
    url = storage.join(url, "checkpoints")
  if not storage.exists(url):
    print(f"jaxpod checkpoint verify: error: {url} does not exist; give a run folder or its checkpoints/",
          file=sys.stderr)
    return 2
  report = verify(url)
  for step, error in report:
    print(f"step {step}: {'ok' if error is None else 'DAMAGED: ' + error}")
  if not report:
    print(f"{url}: no finished checkpoint")
  return 1 if any(error for _, error in report) else 0


def doctor(cfg) -> int:
  """`jaxpod doctor`: exit 1 naming every failed check."""
  import sys
  from jaxpod.runtime.doctor import run
  bad = [c for c in run(cfg) if not c.ok]
  if bad:
    print("jaxpod doctor: " + "; ".join(f"{c.name}: {c.detail}" for c in bad), file=sys.stderr)
    return 1
  return 0


def launch(argv: list[str], prog: str) -> int:
  """`jaxpod launch [options] -- CMD ...`: options before `--`, the command after it."""
  from jaxpod.cli.args import fail, parse, split_command
  from jaxpod.runtime.launcher import LaunchConfig, launch as launch_hosts
  opts, cmd = split_command(argv)
  cfg = parse(LaunchConfig, opts, prog)
  if not cmd:
    raise fail(prog, "no command; usage: jaxpod launch --hosts 2 -- CMD ARGS...")
  return launch_hosts(cmd, cfg).returncode


def sample(cfg) -> int:
  """`jaxpod sample`: on every host; the leader writes the JSONL."""
  from jaxpod import runtime
  from jaxpod.sample.run import run
  with runtime.guard():
    run(cfg)
  runtime.shutdown()
  return 0


def rl(cfg) -> int:
  """`jaxpod rl`: every job of the run (trainer hosts, rollout hosts) calls this with the same config."""
  from jaxpod import runtime
  from jaxpod.rl.run import run
  run(cfg)
  runtime.shutdown()
  return 0


def plot(cfg) -> int:
  """`jaxpod plot RUN_DIR`: a training run's curves, or an RL run's reward and accuracy per policy version."""
  from jaxpod.runtime import storage
  if storage.exists(storage.join(cfg.run_dir, "train", "metrics.jsonl")) and cfg.out is None:
    from jaxpod.rl.summary import plot as plot_rl
    print(plot_rl(cfg.run_dir))
    return 0
  from jaxpod.train.plot import plot_run
  print(plot_run(cfg.run_dir, cfg.out))
  return 0
