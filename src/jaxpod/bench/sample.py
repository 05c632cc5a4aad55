"""`jaxpod bench sample [--json PATH]`: jaxpod's two engines vs HF `generate` (torch CPU), same run.

(a) decode at batch `batch_size`: same random model (saved once in HF layout and loaded by
every engine), same prompts, greedy, no stop tokens (every row generates exactly
max_new_tokens). Engines: `continuous` (slots + paged KV, `jaxpod sample`'s engine),
`lockstep` (the previous fixed-chunk engine) and `hf_generate`. Reported per engine,
medians of `repeats` timed runs, interleaved between the engines, after untimed warm-ups
(compiles included). One fresh process per thread setting (`threads`: 0 = XLA's and
torch's defaults, 1 = both single-threaded) times all engines; each engine is reported at
its faster setting, and every process's same-run rows are in the table and the JSON
(oversubscribed machines make many threads much slower, and an idle torch OpenMP pool
spinning beside XLA halves jaxpod's speed, hence separate processes). The JSON also
records the load average and the fraction of greedy tokens on which they agree:
  ttft_s          time to first token of the batch (prefill + first token)
  prefill_tok_s   batch * prompt_len / ttft
  decode_tok_s    batch * (max_new_tokens - 1) / (full generate time - ttft)
  roofline        decode_tok_s over batch * memcpy bandwidth / weight bytes (decode at batch 8
                  reads every weight once per step; the bandwidth is measured in the same process)
The baseline is HF; `decode_vs_hf` is an engine's decode tok/s over HF's.
(b, c) the RL-rollout workload and KV memory: see `sample_rollout.py`; the slot occupancy
plot goes next to the JSON (`sample_occupancy.png`).
torch and transformers are imported inside `run` only.

`--hosts N` (N > 1) instead re-launches itself as N simulated hosts and times jaxpod's two
modes on `num_prompts` prompts: `global` (model sharded over every host's devices, every host
runs every request) vs `replicated` (a copy per host, requests split over hosts); throughput is
new tokens (prefill included) per second of the whole job, baseline `global`.
"""
from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from jaxpod.bench.common import machine, print_table, write_json
from jaxpod.runtime.extras import require


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
  repeats: int = 3  # timed runs per engine (after one warm-up); medians reported
  hosts: int = 1  # > 1: compare the global and replicated modes on this many simulated hosts (no HF)
  num_prompts: int = 32  # prompts per timed run in the modes comparison
  threads: tuple[int, ...] = (0, 1)  # thread settings tried, one process each: 0 = XLA/torch defaults, 1 = one
  workloads: tuple[str, ...] = ("decode", "rollout")  # decode: (a) at batch_size; rollout: (b) and (c)
  rollout_prompts: int = 64  # prompts of the rollout workload
  rollout_min_prompt: int = 8  # shortest rollout prompt (tokens)
  rollout_max_prompt: int = 200  # longest rollout prompt (tokens)
  rollout_n: int = 4  # samples per prompt
  rollout_max_new: int = 256  # new tokens per sample at most
  rollout_mean_len: int = 100  # stop set = vocab / this ids: ~1/this stop chance per token at temperature 1
  rollout_slots: int = 16  # decode slots (continuous) = rows per chunk (lock-step) = prompts x n per HF batch
  rollout_prefill_batch: int = 4  # prompts per prefill call of the continuous engine
  rollout_page_size: int = 16  # KV page size of the continuous engine (tokens)
  rollout_repeats: int = 1  # timed rollouts per engine (after warm-up); medians reported
  json: str | None = None  # write the results here (and the occupancy plot next to it)


def _timed(fn) -> float:
  t = time.perf_counter()
  fn()
  return time.perf_counter() - t


def _jaxpod_engines(folder: str, tokens: np.ndarray, opts: SampleBench) -> dict[str, dict[str, Any]]:
  """Per jaxpod engine: callables for full generate and prefill + first token (compiled here), greedy tokens."""
  import jax
  from flax import nnx
  from jaxpod.models.llama import hf_io
  from jaxpod.runtime import make_mesh
  from jaxpod.sample import EngineConfig, Sampler, SamplingParams, engine
  mesh = make_mesh(devices=jax.devices()[:1])
  model = hf_io.load(folder, mesh)
  graphdef, params = nnx.split(model)
  b, p = tokens.shape
  ec = EngineConfig(batch_size=b, max_prompt_len=p, max_new_tokens=opts.max_new_tokens)
  gen = engine.compiled_generate(ec, SamplingParams(), ())
  pre = jax.jit(lambda params, t, l: engine.prefill_only(graphdef, params, t, l, ec=ec))
  lengths, seeds = np.full((b,), p, np.int32), np.zeros((b,), np.uint32)
  lock = {"full": lambda: np.asarray(gen(graphdef, params, tokens, lengths, seeds)[0]),
          "first": lambda: np.asarray(pre(params, tokens, lengths).argmax(-1))}
  rows, sd = tokens.tolist(), [0] * b
  cont_full = Sampler(model, mesh, ec, SamplingParams(), ())
  cont_first = Sampler(model, mesh, dataclasses.replace(ec, max_new_tokens=1), SamplingParams(), ())
  cont = {"full": lambda: np.asarray([c.tokens for c in cont_full.generate(rows, sd)]),
          "first": lambda: cont_first.generate(rows, sd)}
  cont_full.warmup(), cont_first.warmup()
  engines = {"continuous": cont, "lockstep": lock}
  for e in engines.values():
    e["tokens"] = e["full"]()  # compiles (lock-step)
    e["first"]()
  return engines


def memcpy_bytes_per_s(nbytes: int = 256 * 2**20, repeats: int = 5) -> float:
  """Median bytes copied per second by numpy's memcpy of a large buffer (the weight-streaming roofline)."""
  src = np.ones(nbytes // 4, np.float32)
  dst = np.empty_like(src)
  return nbytes / statistics.median(_timed(lambda: np.copyto(dst, src)) for _ in range(repeats))


def _hf_engine(folder: str, tokens: np.ndarray, opts: SampleBench, threads: int) -> dict[str, Any]:
  """Callables for HF generate with `threads` torch threads (0: torch's default), plus the greedy tokens."""
  torch = require("torch", "the HF baseline of `jaxpod bench sample`")
  require("transformers", "the HF baseline of `jaxpod bench sample`")
  from transformers import LlamaForCausalLM
  if threads:
    torch.set_num_threads(threads)  # before any torch op: no idle OpenMP pool spinning beside XLA
  model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
  ids = torch.from_numpy(tokens).long()
  mask = torch.ones_like(ids)

  def gen(n):
    with torch.no_grad():
      return model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                            eos_token_id=None, pad_token_id=0)
  gen(2)
  return {"full": lambda: gen(opts.max_new_tokens), "first": lambda: gen(1), "torch_threads": torch.get_num_threads(),
          "tokens": gen(opts.max_new_tokens)[:, tokens.shape[1]:].numpy()}


def _interleaved(engines: dict[str, dict], repeats: int) -> dict[str, dict[str, float]]:
  """Median full / first-token seconds per engine, runs interleaved so load drifts hit all alike."""
  times = {k: {"full_s": [], "ttft_s": []} for k in engines}
  for _ in range(repeats):
    for name, e in engines.items():
      times[name]["full_s"].append(_timed(e["full"]))
      times[name]["ttft_s"].append(_timed(e["first"]))
  return {k: {m: statistics.median(v) for m, v in t.items()} for k, t in times.items()}


def _rates(t: dict[str, float], opts: SampleBench) -> dict[str, float]:
  b, p, n = opts.batch_size, opts.prompt_len, opts.max_new_tokens
  decode_s = max(t["full_s"] - t["ttft_s"], 1e-9)
  return {"ttft_s": t["ttft_s"], "prefill_tok_s": b * p / t["ttft_s"], "decode_tok_s": b * (n - 1) / decode_s,
          "generate_s": t["full_s"]}


def _model_config(opts: SampleBench):
  from jaxpod.models.llama import LlamaConfig
  return LlamaConfig(vocab_size=opts.vocab_size, hidden_size=opts.hidden_size,
                     intermediate_size=opts.intermediate_size, num_hidden_layers=opts.num_layers,
                     num_attention_heads=opts.num_heads, num_key_value_heads=opts.num_kv_heads,
                     rms_norm_eps=1e-5, max_position_embeddings=4096, eos_token_id=())


XLA_SINGLE_THREAD = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def compare(opts: SampleBench, threads: int = 0) -> dict:
  """In this process: the engines on one model, interleaved; (a) rates + roofline, then (b, c) the rollout.

  threads: torch threads (0: default); XLA's threads are fixed by XLA_FLAGS when the process starts."""
  from jaxpod.models.llama import hf_io, init
  cfg = _model_config(opts)
  tokens = np.random.default_rng(0).integers(0, opts.vocab_size, (opts.batch_size, opts.prompt_len)).astype(np.int32)
  out: dict[str, Any] = {"params": cfg.num_params(), "xla_flags": os.environ.get("XLA_FLAGS", "")}
  with tempfile.TemporaryDirectory(prefix="jaxpod-bench-sample-") as folder:
    hf_io.save(init(cfg, seed=0), folder)
    load_before = os.getloadavg()[0]
    if "decode" in opts.workloads:
      engines = _jaxpod_engines(folder, tokens, opts) | {"hf_generate": _hf_engine(folder, tokens, opts, threads)}
      timings = _interleaved(engines, opts.repeats)
      bw = memcpy_bytes_per_s()
      roofline = opts.batch_size * bw / (cfg.num_params() * np.dtype(cfg.dtype).itemsize)
      results = {k: _rates(t, opts) | {"roofline": _rates(t, opts)["decode_tok_s"] / roofline}
                 for k, t in timings.items()}
      for k in ("continuous", "lockstep"):
        results[k]["decode_vs_hf"] = results[k]["decode_tok_s"] / results["hf_generate"]["decode_tok_s"]
      hf = engines["hf_generate"]
      out |= {"results": results, "torch_threads": hf["torch_threads"], "memcpy_gb_s": bw / 1e9,
              "roofline_tok_s": roofline,
              "greedy_tokens_equal_fraction": {k: float(np.mean(engines[k]["tokens"] == hf["tokens"]))
                                               for k in ("continuous", "lockstep")}}
    if "rollout" in opts.workloads:
      if threads:
        import torch
        torch.set_num_threads(threads)
      from jaxpod.bench.sample_rollout import compare_rollout
      out["rollout"] = compare_rollout(folder, opts)
    out["load_average"] = {"before": load_before, "after": os.getloadavg()[0]}
  return out


def _compare_in_child(opts: SampleBench, threads: int) -> dict:
  """`compare` in a fresh process where XLA and torch both use 1 thread (1) or their defaults (0)."""
  import json
  import subprocess
  import sys
  env = dict(os.environ)
  env.pop("JAX_NUM_CPU_DEVICES", None)
  if threads == 1:
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + XLA_SINGLE_THREAD).strip()
  cmd = [sys.executable, "-m", "jaxpod.bench.sample", json.dumps(dataclasses.asdict(opts)), str(threads)]
  proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
  lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
  if proc.returncode or not lines:
    raise RuntimeError(f"bench child (threads={threads}) failed:\n{proc.stdout[-2000:]}{proc.stderr[-4000:]}")
  return json.loads(lines[-1][len("RESULT "):])


ENGINES = ("continuous", "lockstep", "hf_generate")


def _best(by_threads: dict, part: str, metric: str) -> dict[str, dict]:
  """Each engine's row from the process (thread setting) where `metric` was highest."""
  rows = lambda t: by_threads[t][part] if part == "results" else by_threads[t]["rollout"]["results"]  # noqa: E731
  best = {e: max(by_threads, key=lambda t: rows(t)[e][metric]) for e in ENGINES}
  return {e: dict(rows(t)[e], threads=_label(t), thread_setting=t) for e, t in best.items()}


def run(json_path: str | None = None, **overrides) -> dict:
  """Compare the engines in one fresh process per thread setting; report each engine at its
  faster setting (and every process's same-run rows in the JSON and table); table + JSON + plot."""
  opts = dataclasses.replace(SampleBench(json=json_path), **overrides)
  by_threads = {t: _compare_in_child(opts, t) for t in opts.threads}
  params = next(iter(by_threads.values()))["params"]
  payload = {"benchmark": "sample", "baseline": "hf_generate", "options": dataclasses.asdict(opts),
             "params": params, "by_threads": {_label(t): r for t, r in by_threads.items()}, "machine": machine()}
  if "decode" in opts.workloads:
    results = _best(by_threads, "results", "decode_tok_s")
    for e in ("continuous", "lockstep"):
      results[e]["decode_vs_hf"] = results[e]["decode_tok_s"] / results["hf_generate"]["decode_tok_s"]
    payload["results"] = results
    rows = [(f"{e} best ({results[e]['threads']})", *_row(results[e])) for e in ENGINES]
    rows += [(f"  {e} ({_label(t)} process)", *_row(r["results"][e])) for t, r in by_threads.items() for e in ENGINES]
    bw = {_label(t): f"{r['memcpy_gb_s']:.1f}" for t, r in by_threads.items()}
    print_table(f"(a) decode: {params / 1e6:.0f}M params, batch {opts.batch_size}, prompt {opts.prompt_len}, "
                f"{opts.max_new_tokens} new tokens (medians of {opts.repeats}); continuous = "
                f"{results['continuous']['decode_vs_hf']:.2f}x HF, lock-step = {results['lockstep']['decode_vs_hf']:.2f}x"
                f" HF; roofline = batch x memcpy GB/s {bw} / weight bytes",
                ["engine", "decode tok/s", "roofline", "prefill tok/s", "TTFT ms", "generate s"], rows)
  if "rollout" in opts.workloads:
    payload["rollout"] = _report_rollout(opts, by_threads, json_path)
  write_json(json_path, payload)
  return payload


def _report_rollout(opts: SampleBench, by_threads: dict, json_path: str | None) -> dict:
  """(b) and (c): best setting per engine, ratios, the table, and the occupancy plot next to the JSON."""
  from jaxpod.bench.sample_rollout import plot_occupancy
  results = _best(by_threads, "rollout", "tok_s")
  for e in ("continuous", "lockstep"):
    results[e]["vs_hf"] = results[e]["tok_s"] / results["hf_generate"]["tok_s"]
  results["continuous"]["vs_lockstep"] = results["continuous"]["tok_s"] / results["lockstep"]["tok_s"]
  child = by_threads[results["continuous"]["thread_setting"]]["rollout"]
  occ = [o for _, o in child["occupancy"]]
  out = {"results": results, "kv_memory": child["kv_memory"], "preemptions": child["preemptions"],
         "rounds": child["rounds"], "mean_occupancy": float(np.mean(occ)) / child["slots"] if occ else 0.0}
  if json_path:
    out["occupancy_png"] = str(Path(json_path).parent / "sample_occupancy.png")
    plot_occupancy(child["occupancy"], child["slots"], out["occupancy_png"])
  mem = child["kv_memory"]
  rows = [(f"{e} ({results[e]['threads']})", results[e]["tok_s"], results[e]["tokens"],
           f"{results[e]['len_min']}/{results[e]['len_median']:.0f}/{results[e]['len_max']}", results[e]["generate_s"])
          for e in ENGINES]
  print_table(f"(b) rollout: {opts.rollout_prompts} prompts of {opts.rollout_min_prompt}-{opts.rollout_max_prompt} "
              f"tokens x n={opts.rollout_n}, <= {opts.rollout_max_new} new, {opts.rollout_slots} rows; continuous = "
              f"{results['continuous']['vs_hf']:.2f}x HF, {results['continuous']['vs_lockstep']:.2f}x lock-step; "
              f"(c) peak KV {mem['paged_peak_bytes'] / 2**20:.1f} MiB paged ({mem['peak_pages']} pages) vs "
              f"{mem['static_bytes'] / 2**20:.1f} MiB static = {mem['static_over_paged']:.2f}x less; "
              f"occupancy {out['mean_occupancy']:.0%}",
              ["engine", "generated tok/s", "tokens", "len min/med/max", "wall s"], rows)
  return out


def _label(threads: int) -> str:
  return "1 thread" if threads == 1 else "default threads"


def _row(r: dict) -> tuple:
  return r["decode_tok_s"], f"{r['roofline']:.0%}", r["prefill_tok_s"], r["ttft_s"] * 1e3, r["generate_s"]


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
  kwargs["threads"], kwargs["workloads"] = tuple(opts.threads), tuple(opts.workloads)
  if opts.hosts <= 1:
    run(json_path=opts.json, **kwargs)
  else:
    run_modes(json_path=opts.json, **kwargs)
  return 0


if __name__ == "__main__":  # the child of `run`: python -m jaxpod.bench.sample '<SampleBench as JSON>'
  import json
  import sys
  fields = json.loads(sys.argv[1])
  fields["threads"], fields["workloads"] = tuple(fields["threads"]), tuple(fields["workloads"])
  print("RESULT " + json.dumps(compare(SampleBench(**fields), int(sys.argv[2]))), flush=True)
