"""`jaxpod bench sample [--json PATH]`: jaxpod's sampler vs HF `generate` (torch CPU), same run.

Same random model (saved once in HF layout and loaded by both), same prompts, greedy, no
stop tokens (every row generates exactly max_new_tokens). Reported per engine, medians of
`repeats` timed runs, interleaved between the engines, after untimed warm-ups (jaxpod's
compile included); HF runs at the faster of 1 and all-core torch threads. The JSON also
records the load average and the fraction of greedy tokens on which the two engines agree:
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


def _hf_engine(folder: str, tokens: np.ndarray, opts: SampleBench) -> dict[str, Any]:
  """Callables for HF generate, at the faster of 1 and all-core torch threads (oversubscribed
  machines can make many threads much slower), plus the greedy tokens."""
  import os
  import torch
  from transformers import LlamaForCausalLM
  model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
  ids = torch.from_numpy(tokens).long()
  mask = torch.ones_like(ids)

  def gen(n):
    with torch.no_grad():
      return model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                            eos_token_id=None, pad_token_id=0)
  by_threads = {}
  for n in sorted({1, os.cpu_count() or 1}):
    torch.set_num_threads(n)
    gen(2)
    by_threads[n] = _timed(lambda: gen(8))
  best = min(by_threads, key=by_threads.get)
  torch.set_num_threads(best)
  return {"full": lambda: gen(opts.max_new_tokens), "first": lambda: gen(1), "torch_threads": best,
          "seconds_for_8_tokens_by_threads": by_threads,
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


def run(json_path: str | None = None, **overrides) -> dict:
  """Time both engines on one model and one prompt batch; print a rich table, write JSON."""
  from jaxpod.models.llama import hf_io, init
  opts = dataclasses.replace(SampleBench(json=json_path), **overrides)
  cfg = _model_config(opts)
  tokens = np.random.default_rng(0).integers(0, opts.vocab_size, (opts.batch_size, opts.prompt_len)).astype(np.int32)
  with tempfile.TemporaryDirectory(prefix="jaxpod-bench-sample-") as folder:
    hf_io.save(init(cfg, seed=0), folder)
    engines = {"jaxpod": _jaxpod_engine(folder, tokens, opts), "hf_generate": _hf_engine(folder, tokens, opts)}
    load_before = os.getloadavg()[0]
    timings = _interleaved(engines, opts.repeats)
  same = float(np.mean(engines["jaxpod"]["tokens"] == engines["hf_generate"]["tokens"]))
  results = {k: _rates(t, opts) for k, t in timings.items()}
  results["jaxpod"]["decode_vs_hf"] = results["jaxpod"]["decode_tok_s"] / results["hf_generate"]["decode_tok_s"]
  hf = engines["hf_generate"]
  payload = {"benchmark": "sample", "baseline": "hf_generate", "options": dataclasses.asdict(opts),
             "params": cfg.num_params(), "torch_threads": hf["torch_threads"],
             "hf_seconds_for_8_tokens_by_torch_threads": hf["seconds_for_8_tokens_by_threads"],
             "greedy_tokens_equal_fraction": same, "results": results,
             "load_average": {"before": load_before, "after": os.getloadavg()[0]}, "machine": machine()}
  rows = [(k, v["decode_tok_s"], v["prefill_tok_s"], v["ttft_s"] * 1e3, v["generate_s"]) for k, v in results.items()]
  print_table(f"sample: {cfg.num_params() / 1e6:.0f}M params, batch {opts.batch_size}, prompt {opts.prompt_len}, "
              f"{opts.max_new_tokens} new tokens (medians of {opts.repeats})",
              ["engine", "decode tok/s", "prefill tok/s", "TTFT ms", "generate s"], rows)
  write_json(json_path, payload)
  return payload


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


def cli(argv: list[str]) -> int:
  """`jaxpod bench sample [--json PATH] [--hosts N] [--batch-size N] ...`."""
  import os
  import sys
  from jaxpod.cli.args import parse
  from jaxpod.runtime import hosts as hosts_lib
  opts = parse(SampleBench, argv, "jaxpod bench sample")
  kwargs = {k: v for k, v in dataclasses.asdict(opts).items() if k != "json"}
  if opts.hosts <= 1:
    run(json_path=opts.json, **kwargs)
    return 0
  if hosts_lib.ENV_PROCESS_ID not in os.environ:
    from jaxpod.runtime.launcher import LaunchConfig, launch
    cmd = [sys.executable, "-m", "jaxpod.cli.main", "bench", "sample", *argv]
    return launch(cmd, LaunchConfig(hosts=opts.hosts), echo_hosts={0}).returncode
  run_modes(json_path=opts.json, **kwargs)
  return 0
