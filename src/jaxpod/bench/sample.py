"""`jaxpod bench sample [--json PATH]`: jaxpod's sampler vs HF `generate` (torch CPU), same run.

Same random model (saved once in HF layout and loaded by both), same prompts, greedy, no
stop tokens (every row generates exactly max_new_tokens). Reported per engine, medians of
`repeats` timed runs, interleaved between the engines, after untimed warm-ups (jaxpod's
compile included). One fresh process per thread setting (`threads`: 0 = XLA's and torch's
defaults, 1 = both single-threaded) times both engines; each engine is reported at its
faster setting, and every process's same-run pair is in the table and the JSON
(oversubscribed machines make many threads much slower, and an idle torch OpenMP pool
spinning beside XLA halves jaxpod's speed, hence separate processes). The JSON also
records the load average and the fraction of greedy tokens on which they agree:
  ttft_s          time to first token of the batch (prefill + first token)
  prefill_tok_s   batch * prompt_len / ttft
  decode_tok_s    batch * (max_new_tokens - 1) / (full generate time - ttft)
The baseline is HF; `decode_vs_hf` is jaxpod's decode tok/s over HF's.
torch and transformers are imported inside `run` only.

`--hosts N` (N > 1) instead re-launches itself as N simulated hosts and times jaxpod's two
modes on `num_prompts` prompts: `global` (model sharded over every host's devices, every host
runs every chunk) vs `replicated` (a copy per host, chunks split over hosts); throughput is
new tokens (prefill included) per second of the whole job, baseline `global`.
"""
from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
import time
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
  json: str | None = None  # write the results here


def _timed(fn) -> float:
  t = time.perf_counter()
  fn()
  return time.perf_counter() - t


def _jaxpod_engine(folder: str, tokens: np.ndarray, opts: SampleBench) -> dict[str, Any]:
  """Callables: full generate and prefill alone (both compiled here), plus the greedy tokens."""
  import jax
  from flax import nnx
  from jaxpod.models.llama import hf_io
  from jaxpod.runtime import make_mesh
  from jaxpod.sample import EngineConfig, SamplingParams, engine
  mesh = make_mesh(devices=jax.devices()[:1])
  graphdef, params = nnx.split(hf_io.load(folder, mesh))
  b, p = tokens.shape
  ec = EngineConfig(batch_size=b, max_prompt_len=p, max_new_tokens=opts.max_new_tokens)
  gen = engine.compiled_generate(ec, SamplingParams(), ())
  pre = jax.jit(lambda params, t, l: engine.prefill_only(graphdef, params, t, l, ec=ec))
  lengths, seeds = np.full((b,), p, np.int32), np.zeros((b,), np.uint32)
  full = lambda: np.asarray(gen(graphdef, params, tokens, lengths, seeds))  # noqa: E731
  first = lambda: np.asarray(pre(params, tokens, lengths).argmax(-1))  # noqa: E731
  out = full()  # compiles
  first()
  return {"full": full, "first": first, "tokens": out}


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
  """In this process: both engines on one model and one prompt batch, interleaved; rates + checks.

  threads: torch threads (0: default); XLA's threads are fixed by XLA_FLAGS when the process starts."""
  from jaxpod.models.llama import hf_io, init
  cfg = _model_config(opts)
  tokens = np.random.default_rng(0).integers(0, opts.vocab_size, (opts.batch_size, opts.prompt_len)).astype(np.int32)
  with tempfile.TemporaryDirectory(prefix="jaxpod-bench-sample-") as folder:
    hf_io.save(init(cfg, seed=0), folder)
    engines = {"jaxpod": _jaxpod_engine(folder, tokens, opts), "hf_generate": _hf_engine(folder, tokens, opts, threads)}
    load_before = os.getloadavg()[0]
    timings = _interleaved(engines, opts.repeats)
  results = {k: _rates(t, opts) for k, t in timings.items()}
  results["jaxpod"]["decode_vs_hf"] = results["jaxpod"]["decode_tok_s"] / results["hf_generate"]["decode_tok_s"]
  hf = engines["hf_generate"]
  return {"results": results, "params": cfg.num_params(), "torch_threads": hf["torch_threads"],
          "greedy_tokens_equal_fraction": float(np.mean(engines["jaxpod"]["tokens"] == hf["tokens"])),
          "load_average": {"before": load_before, "after": os.getloadavg()[0]},
          "xla_flags": os.environ.get("XLA_FLAGS", "")}


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


def run(json_path: str | None = None, **overrides) -> dict:
  """Compare the engines in one fresh process per thread setting; report each engine at its
  faster setting (and every process's same-run pair in the JSON and table); table + JSON."""
  opts = dataclasses.replace(SampleBench(json=json_path), **overrides)
  by_threads = {t: _compare_in_child(opts, t) for t in opts.threads}
  best = {e: max(by_threads, key=lambda t: by_threads[t]["results"][e]["decode_tok_s"])
          for e in ("jaxpod", "hf_generate")}
  results = {e: dict(by_threads[t]["results"][e], threads=_label(t)) for e, t in best.items()}
  results["jaxpod"]["decode_vs_hf"] = results["jaxpod"]["decode_tok_s"] / results["hf_generate"]["decode_tok_s"]
  params = next(iter(by_threads.values()))["params"]
  payload = {"benchmark": "sample", "baseline": "hf_generate", "options": dataclasses.asdict(opts),
             "params": params, "results": results, "by_threads": {_label(t): r for t, r in by_threads.items()},
             "machine": machine()}
  rows = [(f"{e} best ({results[e]['threads']})", *_row(results[e])) for e in results]
  rows += [(f"  {e} ({_label(t)} process)", *_row(r["results"][e])) for t, r in by_threads.items()
           for e in ("jaxpod", "hf_generate")]
  print_table(f"sample: {params / 1e6:.0f}M params, batch {opts.batch_size}, prompt {opts.prompt_len}, "
              f"{opts.max_new_tokens} new tokens (medians of {opts.repeats}); jaxpod decode = "
              f"{results['jaxpod']['decode_vs_hf']:.2f}x HF",
              ["engine", "decode tok/s", "prefill tok/s", "TTFT ms", "generate s"], rows)
  write_json(json_path, payload)
  return payload


def _label(threads: int) -> str:
  return "1 thread" if threads == 1 else "default threads"


def _row(r: dict) -> tuple:
  return r["decode_tok_s"], r["prefill_tok_s"], r["ttft_s"] * 1e3, r["generate_s"]


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
  kwargs["threads"] = tuple(opts.threads)
  if opts.hosts <= 1:
    run(json_path=opts.json, **kwargs)
  else:
    run_modes(json_path=opts.json, **kwargs)
  return 0


if __name__ == "__main__":  # the child of `run`: python -m jaxpod.bench.sample '<SampleBench as JSON>'
  import json
  import sys
  fields = json.loads(sys.argv[1])
  fields["threads"] = tuple(fields["threads"])
  print("RESULT " + json.dumps(compare(SampleBench(**fields), int(sys.argv[2]))), flush=True)
