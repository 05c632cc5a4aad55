"""`jaxpod bench sample [--json PATH]`: jaxpod's engines (continuous, each KV layout; lock-step) vs HF `generate`.

Two child processes (`engines.py`) load the same random model (saved once in HF
layout): "jax" serves jaxpod's engines, "hf" serves HF generate (torch CPU; a separate
process, so its thread pool never runs beside XLA's). After every engine is compiled and
warmed up, the parent interleaves timed runs over all engines and both processes, so load
drifts on a shared machine hit every engine alike; medians are reported. Engines:
`continuous_<layout>` for each `layouts` entry (`continuous` = the default layout, the one
`jaxpod sample` runs), `lockstep` (the fixed-chunk reference engine) and `hf_generate`.

(a) decode at batch `batch_size`: same prompts, greedy, no stop tokens (every row generates
    exactly max_new_tokens):
      ttft_s          time to first token of the batch (prefill + first token)
      prefill_tok_s   batch * prompt_len / ttft
      decode_tok_s    batch * (max_new_tokens - 1) / (full generate time - ttft)
      roofline        decode_tok_s over batch * memcpy bandwidth / weight bytes (decode at batch 8
                      reads every weight once per step; the bandwidth is measured in the jax process)
    plus the fraction of greedy tokens equal to HF's; then (a') the same decode for each of `families` (a model
    of that family at the same size: Qwen3's q/k norms, Gemma 3's norms, GELU, 5:1 sliding:full layers ...),
    jaxpod's default layout vs HF generate, each family in its own pair of child processes.
(b) the RL rollout (see `rollout.py`): mixed prompt lengths, n samples per prompt,
    stop tokens; generated tok/s, prefill work per prompt token, slot occupancy (plot next to
    the JSON), KV memory (paged peak vs a static cache), and a profile of the default layout:
    share of wall time in attention, matmuls, sampling, other device ops and host-side work
    (`bench/common.py`'s profile).

`--hosts N` (N > 1) instead re-launches itself as N simulated hosts and times jaxpod's two
modes on `num_prompts` prompts: `global` (model sharded over every host's devices, every host
runs every request) vs `replicated` (a copy per host, requests split over hosts); throughput is
new tokens (prefill included) per second of the whole job, baseline `global`.
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
from pathlib import Path
from typing import Any

import numpy as np

from jaxpod.bench.common import CATEGORIES, EIGEN_DOTS_CAVEAT, eigen_dots, machine, print_table, wall_shares, write_json


@dataclasses.dataclass(frozen=True)
class SampleBench:
  """Options of `jaxpod bench sample`."""

  hidden_size: int = 512
  num_layers: int = 8
  vocab_size: int = 32000
  intermediate_size: int = 1408
  num_heads: int = 8
  num_kv_heads: int = 8
  batch_size: int = 8
  prompt_len: int = 64
  max_new_tokens: int = 64
  repeats: int = 5  # timed decode runs per engine (after warm-up); medians reported
  hosts: int = 1  # > 1: compare the global and replicated modes on this many simulated hosts (no HF)
  num_prompts: int = 32  # prompts per timed run in the modes comparison
  threads: int = 0  # XLA's and torch's threads in their processes: 0 = their defaults, 1 = one each
  workloads: tuple[str, ...] = ("decode", "rollout")  # decode: (a) at batch_size; rollout: (b); episodes: multi-turn
  layouts: tuple[str, ...] = ("slots", "paged")  # KV layouts of the continuous engine; the first is the default
  min_prefill_len: int = 16  # smallest prefill bucket and slot KV capacity of jaxpod's engines
  rollout_prompts: int = 24  # prompts of the rollout workload
  rollout_min_prompt: int = 8  # shortest rollout prompt (tokens)
  rollout_max_prompt: int = 128  # longest rollout prompt (tokens)
  rollout_n: int = 4  # samples per prompt
  rollout_max_new: int = 128  # new tokens per sample at most
  rollout_mean_len: int = 48  # stop set = vocab / this ids: ~1/this stop chance per token at temperature 1
  rollout_slots: int = 16  # decode slots (continuous) = rows per chunk (lock-step) = prompts x n per HF batch
  rollout_prefill_batch: int = 1  # prompts per prefill call of the continuous engine
  rollout_page_size: int = 16  # KV page size of the paged layout (tokens)
  rollout_repeats: int = 1  # timed rollouts per engine (after warm-up); medians reported
  profile: bool = True  # profile the default layout on the rollout (one more traced rollout)
  families: tuple[str, ...] = ("gemma3_text",)  # decode rows for these families at the same size (llama is (a))
  json: str | None = None  # write the results here (and the occupancy plot next to it)

  def __post_init__(self):
    from jaxpod.sample.config import KV_LAYOUTS
    bad = [x for x in self.layouts if x not in KV_LAYOUTS]
    if bad or not self.layouts:
      raise ValueError(f"bench.layouts={self.layouts}; use one or more of {KV_LAYOUTS} (the first is the default)")
    from jaxpod.models.llama.families import SUPPORTED
    if any(f not in SUPPORTED for f in self.families):
      raise ValueError(f"bench.families={self.families}; use some of {SUPPORTED}")
    if self.threads < 0:
      raise ValueError(f"bench.threads={self.threads} must be >= 0 (0: XLA's and torch's defaults)")


XLA_SINGLE_THREAD = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


class Child:
  """One engine process (`engines.py`): started now, warming up while the other one does too."""

  def __init__(self, side: str, opts: SampleBench, folder: str):
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")  # an idle torch pool sleeps instead of spinning
    env.pop("JAX_NUM_CPU_DEVICES", None)
    if opts.threads == 1:
      env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + XLA_SINGLE_THREAD).strip()
    self.side, self.log = side, tempfile.TemporaryFile(mode="w+")
    cmd = [sys.executable, "-m", "jaxpod.bench.sample.engines", side, json.dumps(dataclasses.asdict(opts)), folder]
    self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                 text=True)

  def _line(self, prefix: str) -> str:
    for line in self.proc.stdout:
      if line.startswith(prefix):
        return line[len(prefix):]
    self.log.seek(0)
    raise RuntimeError(f"bench child {self.side!r} exited ({self.proc.wait()}):\n{self.log.read()[-4000:]}")

  def ready(self) -> None:
    self._line("READY")

  def ask(self, cmd: str, name: str = "") -> Any:
    self.proc.stdin.write(f"{cmd} {name}\n")
    self.proc.stdin.flush()
    return json.loads(self._line("RESULT "))

  def close(self) -> None:
    if self.proc.poll() is None:
      self.proc.stdin.write("quit\n")
      self.proc.stdin.close()
      self.proc.wait(timeout=60)


# What a family's config.json adds to a Llama one of the same size (its released models' values)
FAMILY_KEYS = {"llama": {}, "qwen2": {}, "qwen3": {}, "mistral": {"sliding_window": 4096},
               "gemma3_text": {"sliding_window": 512, "hidden_activation": "gelu_pytorch_tanh"}}


def _model_config(opts: SampleBench, family: str = "llama"):
  """The benchmark model: a Llama of the options' size, or that size in another family (through its config.json)."""
  from jaxpod.models.llama import LlamaConfig
  cfg = LlamaConfig(vocab_size=opts.vocab_size, hidden_size=opts.hidden_size,
                    intermediate_size=opts.intermediate_size, num_hidden_layers=opts.num_layers,
                    num_attention_heads=opts.num_heads, num_key_value_heads=opts.num_kv_heads,
                    rms_norm_eps=1e-5, max_position_embeddings=4096, eos_token_id=())
  if family == "llama":
    return cfg
  return LlamaConfig.from_hf_config({**cfg.to_hf_config(), "model_type": family, **FAMILY_KEYS[family]})


def _engines(opts: SampleBench) -> dict[str, str]:
  """Engine name -> the child that serves it."""
  return {**{f"continuous_{x}": "jax" for x in opts.layouts}, "lockstep": "jax", "hf_generate": "hf"}


def _interleaved(children: dict[str, Child], engines: dict[str, str], cmd: str, repeats: int) -> dict[str, list]:
  """`repeats` answers per engine to `cmd`, the engines taking turns in an order that rotates every repeat (the
  engine run right after the other process starts with caches full of that process's data)."""
  out: dict[str, list] = {e: [] for e in engines}
  names = list(engines)
  for r in range(repeats):
    for e in names[r % len(names):] + names[:r % len(names)]:
      out[e].append(children[engines[e]].ask(cmd, e))
  return out


def run(json_path: str | None = None, **overrides) -> dict:
  """Compile every engine in its process, interleave the timed runs, report tables + JSON + plot."""
  from jaxpod.models.llama import hf_io, init
  opts = dataclasses.replace(SampleBench(json=json_path), **overrides)
  cfg = _model_config(opts)
  engines = _engines(opts)
  t0 = time.perf_counter()
  payload: dict[str, Any] = {"benchmark": "sample", "baseline": "hf_generate", "options": dataclasses.asdict(opts),
                             "params": cfg.num_params(), "default_layout": opts.layouts[0], "machine": machine()}
  with tempfile.TemporaryDirectory(prefix="jaxpod-bench-sample-") as folder:
    hf_io.save(init(cfg, seed=0), folder)
    children = {side: Child(side, opts, folder) for side in ("jax", "hf")}
    try:
      for c in children.values():
        c.ready()
      payload["warmup_s"] = time.perf_counter() - t0
      payload["load_average"] = {"before": os.getloadavg()[0]}
      if "decode" in opts.workloads:
        payload |= _decode(opts, cfg, children, engines)
      if "rollout" in opts.workloads:
        payload["rollout"] = _rollout(opts, children, engines, json_path)
      if "episodes" in opts.workloads:
        from jaxpod.bench.sample.rollout import episodes_report
        payload["episodes"] = episodes_report(opts, lambda name: children["jax"].ask("episodes", name))
      payload["load_average"]["after"] = os.getloadavg()[0]
    finally:
      for c in children.values():
        c.close()
  if "decode" in opts.workloads and opts.families:
    payload["families"] = _families(opts, payload["results"])
  payload["wall_s"] = time.perf_counter() - t0
  write_json(json_path, payload)
  return payload


def _families(opts: SampleBench, llama: dict) -> dict:
  """(a'): decode of each family's model at the same size, jaxpod's default layout vs HF generate; the table."""
  from jaxpod.models.llama import hf_io, init
  default = f"continuous_{opts.layouts[0]}"
  engines = {default: "jax", "hf_generate": "hf"}
  one = dataclasses.replace(opts, workloads=("decode",), layouts=opts.layouts[:1])
  out = {"llama": {"params": _model_config(opts).num_params(), "decode_tok_s": llama[default]["decode_tok_s"],
                   "hf_decode_tok_s": llama["hf_generate"]["decode_tok_s"],
                   "decode_vs_hf": llama[default]["decode_vs_hf"], "greedy_tokens_equal_fraction": None}}
  for family in opts.families:
    cfg = _model_config(opts, family)
    with tempfile.TemporaryDirectory(prefix=f"jaxpod-bench-sample-{family}-") as folder:
      hf_io.save(init(cfg, seed=0), folder)
      children = {side: Child(side, one, folder) for side in ("jax", "hf")}
      try:
        for c in children.values():
          c.ready()
        runs = _interleaved(children, engines, "decode", opts.repeats)
        agree = float(np.mean(np.asarray(children["jax"].ask("decode_tokens", default))
                              == np.asarray(children["hf"].ask("decode_tokens", "hf_generate"))))
      finally:
        for c in children.values():
          c.close()
    b, n = opts.batch_size, opts.max_new_tokens
    rate = {e: b * (n - 1) / max(statistics.median(r["full_s"] for r in rs)
                                 - statistics.median(r["ttft_s"] for r in rs), 1e-9) for e, rs in runs.items()}
    out[family] = {"params": cfg.num_params(), "decode_tok_s": rate[default], "hf_decode_tok_s": rate["hf_generate"],
                   "decode_vs_hf": rate[default] / rate["hf_generate"], "greedy_tokens_equal_fraction": agree}
  rows = [(f, r["params"] / 1e6, r["decode_tok_s"], r["hf_decode_tok_s"], f"{r['decode_vs_hf']:.2f}x",
           "-" if r["greedy_tokens_equal_fraction"] is None else f"{r['greedy_tokens_equal_fraction']:.0%}")
          for f, r in out.items()]
  print_table(f"(a') decode by family at the same size: batch {opts.batch_size}, prompt {opts.prompt_len}, "
              f"{opts.max_new_tokens} new tokens, greedy; jaxpod {default} vs HF generate (medians of {opts.repeats}, "
              "interleaved; llama: the (a) run)",
              ["family", "M params", "jaxpod tok/s", "HF tok/s", "vs HF", "= HF tokens"], rows)
  return out


def _with_default(results: dict, opts: SampleBench) -> dict:
  """`continuous` = the default layout's row (what `jaxpod sample` runs)."""
  return {"continuous": dict(results[f"continuous_{opts.layouts[0]}"], layout=opts.layouts[0]), **results}


def _decode(opts: SampleBench, cfg, children: dict[str, Child], engines: dict[str, str]) -> dict:
  """(a): rates, roofline, token agreement; the table."""
  runs = _interleaved(children, engines, "decode", opts.repeats)
  bw = children["jax"].ask("memcpy")
  roofline = opts.batch_size * bw / (cfg.num_params() * np.dtype(cfg.dtype).itemsize)
  b, p, n = opts.batch_size, opts.prompt_len, opts.max_new_tokens
  results = {}
  for e, rs in runs.items():
    full, ttft = statistics.median(r["full_s"] for r in rs), statistics.median(r["ttft_s"] for r in rs)
    decode = b * (n - 1) / max(full - ttft, 1e-9)
    results[e] = {"ttft_s": ttft, "prefill_tok_s": b * p / ttft, "decode_tok_s": decode, "generate_s": full,
                  "roofline": decode / roofline}
  hf = np.asarray(children["hf"].ask("decode_tokens", "hf_generate"))
  agree = {e: float(np.mean(np.asarray(children["jax"].ask("decode_tokens", e)) == hf))
           for e in engines if e != "hf_generate"}
  for e in results:
    results[e]["decode_vs_hf"] = results[e]["decode_tok_s"] / results["hf_generate"]["decode_tok_s"]
    results[e]["decode_vs_lockstep"] = results[e]["decode_tok_s"] / results["lockstep"]["decode_tok_s"]
  results = _with_default(results, opts)
  rows = [(e, r["decode_tok_s"], f"{r['roofline']:.0%}", f"{r['decode_vs_lockstep']:.2f}x", f"{r['decode_vs_hf']:.2f}x",
           r["prefill_tok_s"], r["ttft_s"] * 1e3, f"{agree.get(e, 1.0):.0%}") for e, r in results.items()
          if e != "continuous"]
  print_table(f"(a) decode: {cfg.num_params() / 1e6:.0f}M params, batch {b}, prompt {p}, {n} new tokens, greedy "
              f"(medians of {opts.repeats}, interleaved); roofline = batch x memcpy {bw / 1e9:.1f} GB/s / weight bytes; "
              f"default layout: {opts.layouts[0]}",
              ["engine", "decode tok/s", "roofline", "vs lock-step", "vs HF", "prefill tok/s", "TTFT ms",
               "= HF tokens"], rows)
  return {"results": results, "memcpy_gb_s": bw / 1e9, "roofline_tok_s": roofline,
          "greedy_tokens_equal_fraction": agree}


def _rollout(opts: SampleBench, children: dict[str, Child], engines: dict[str, str], json_path: str | None) -> dict:
  """(b): throughput, prefill work, occupancy, KV memory, profile; the tables and the plot."""
  runs = _interleaved(children, engines, "rollout", opts.rollout_repeats)
  results = {}
  for e, rs in runs.items():
    wall = statistics.median(r["wall_s"] for r in rs)
    c = rs[-1]["counts"]
    stats = {k: v for k, v in rs[-1]["stats"].items() if k != "occupancy"}
    results[e] = {"generate_s": wall, "tokens": sum(c), "tok_s": sum(c) / wall, "len_min": min(c),
                  "len_median": statistics.median(c), "len_max": max(c), **stats}
  for e in results:
    results[e]["vs_hf"] = results[e]["tok_s"] / results["hf_generate"]["tok_s"]
    results[e]["vs_lockstep"] = results[e]["tok_s"] / results["lockstep"]["tok_s"]
    # a decode step reads every weight once, so at the memory bound the ratio of steps caps decode's gain
    results[e]["step_bound"] = results["lockstep"]["decode_steps"] / max(results[e]["decode_steps"], 1)
  results = _with_default(results, opts)
  default = f"continuous_{opts.layouts[0]}"
  out: dict[str, Any] = {"results": results}
  if "continuous_paged" in runs:
    paged = results["continuous_paged"]
    out["kv_memory"] = {"paged_peak_bytes": paged["kv_peak_bytes"], "static_bytes": paged["static_kv_bytes"],
                        "peak_pages": paged["peak_pages"], "page_size": opts.rollout_page_size,
                        "static_over_paged": paged["static_kv_bytes"] / max(paged["kv_peak_bytes"], 1)}
  if json_path:
    from jaxpod.bench.sample.rollout import plot_occupancy
    out["occupancy_png"] = str(Path(json_path).parent / "sample_occupancy.png")
    plot_occupancy(runs[default][-1]["stats"]["occupancy"], opts.rollout_slots, out["occupancy_png"], default)
  rows = [(e, r["tok_s"], f"{r['vs_lockstep']:.2f}x", f"{r['vs_hf']:.2f}x", r["tokens"],
           f"{r['len_min']}/{r['len_median']:.0f}/{r['len_max']}", f"{r['prefill_real_per_prompt_token']:.2f}",
           f"{r['prefill_computed_per_prompt_token']:.2f}",
           f"{r['mean_occupancy']:.0%}" if "mean_occupancy" in r else "-", r["decode_steps"],
           f"{r['step_bound']:.2f}x", r["generate_s"])
          for e, r in results.items() if e != "continuous"]
  mem = out.get("kv_memory")
  print_table(f"(b) rollout: {opts.rollout_prompts} prompts of {opts.rollout_min_prompt}-{opts.rollout_max_prompt} "
              f"tokens x n={opts.rollout_n}, <= {opts.rollout_max_new} new, stop chance 1/{opts.rollout_mean_len}, "
              f"{opts.rollout_slots} rows; prefill = prompt tokens prefilled per prompt token of the samples (real / "
              f"computed incl. padding); step bound = lock-step's decode steps / the engine's (each step reads every "
              f"weight once, so at the memory bound it caps the decode part of the gain)"
              + (f"; KV: paged peak {mem['paged_peak_bytes'] / 2**20:.1f} MiB vs static "
                 f"{mem['static_bytes'] / 2**20:.1f} MiB = {mem['static_over_paged']:.2f}x less" if mem else ""),
              ["engine", "generated tok/s", "vs lock-step", "vs HF", "tokens", "len min/med/max", "prefill real",
               "prefill computed", "occupancy", "decode steps", "step bound", "wall s"], rows)
  if opts.profile:
    out["profile"] = _profile(opts, children["jax"], default, results[default])
  return out


def _profile(opts: SampleBench, jax_child: Child, engine: str, row: dict) -> dict:
  """Shares of the default layout's rollout wall time: device categories (a traced rollout) and host."""
  shares = wall_shares(jax_child.ask("profile", engine), row["device_s"], row["generate_s"])
  untraced = eigen_dots()  # the child runs with this process's XLA_FLAGS
  print_table(f"profile of {engine} on the rollout: share of wall time (device ops from a traced run, "
              "host = outside device calls)" + (f"; {EIGEN_DOTS_CAVEAT}" if untraced else ""), list(CATEGORIES),
              [tuple(f"{shares[c]:.0%}" for c in CATEGORIES)])
  return {"engine": engine, "shares": shares, "untraced_dots": untraced}


def run_modes(json_path: str | None = None, **overrides) -> dict:
  """On every host of a launch: global vs replicated throughput on the same prompts; leader reports."""
  import jax
  from flax import nnx
  from jaxpod import runtime
  from jaxpod.models.llama import abstract, init
  from jaxpod.runtime import MeshConfig, state_shardings
  from jaxpod.sample import EngineConfig, Sampler, SamplingParams, make_sample_mesh
  opts = dataclasses.replace(SampleBench(json=json_path), **overrides)
  host = runtime.init()
  cfg = _model_config(opts)
  rng = np.random.default_rng(0)  # fixed by config, so the same prompts on every host
  ids = rng.integers(0, opts.vocab_size, (opts.num_prompts, opts.prompt_len)).tolist()
  ec = EngineConfig(batch_size=opts.batch_size, max_prompt_len=opts.prompt_len, max_new_tokens=opts.max_new_tokens)
  results = {}
  for mode in ("global", "replicated"):
    mesh = make_sample_mesh(mode, MeshConfig())
    model = init(cfg, seed=0, shardings=state_shardings(nnx.split(abstract(cfg))[1], mesh))
    sampler = Sampler(model, mesh, ec, SamplingParams(), (), mode=mode)
    seeds = list(range(len(ids)))
    sampler.generate(ids[:opts.batch_size * host.process_count], seeds)  # compile + warm-up
    times = []
    for _ in range(opts.repeats):
      runtime.barrier("bench.sample.modes", 600)
      t = time.perf_counter()
      sampler.generate(ids, seeds)
      times.append(time.perf_counter() - t)
    wall = statistics.median(runtime.allgather(statistics.median(times), "bench.sample.times"))
    results[mode] = {"generate_s": wall, "new_tok_s": opts.num_prompts * opts.max_new_tokens / wall}
    del model, sampler
  results["replicated"]["vs_global"] = results["replicated"]["new_tok_s"] / results["global"]["new_tok_s"]
  payload = {"benchmark": "sample_modes", "baseline": "global", "hosts": host.process_count,
             "devices": jax.device_count(), "options": dataclasses.asdict(opts), "results": results,
             "machine": machine()}
  if host.is_leader:
    print_table(f"sample modes: {host.process_count} hosts, {jax.device_count()} devices, {opts.num_prompts} "
                f"prompts x {opts.max_new_tokens} new tokens (medians of {opts.repeats})",
                ["mode", "new tok/s", "generate s"], [(k, v["new_tok_s"], v["generate_s"]) for k, v in results.items()])
    write_json(json_path, payload)
  runtime.barrier("bench.sample.end", 600)
  return payload


def cli(opts: SampleBench) -> int:
  """Entry of `jaxpod bench sample` (with --hosts N > 1, on every host of the launch)."""
  kwargs = {k: v for k, v in dataclasses.asdict(opts).items() if k != "json"}
  kwargs["workloads"], kwargs["layouts"] = tuple(opts.workloads), tuple(opts.layouts)
  if opts.hosts <= 1:
    run(json_path=opts.json, **kwargs)
  else:
    run_modes(json_path=opts.json, **kwargs)
  return 0
