"""`jaxpod bench extract`: tokens/s of jaxpod extraction vs the transformers forward with
`output_hidden_states=True` (torch CPU), same model, prompts and batches, same run.

One process. A random HF Llama checkpoint is written to a temporary folder by transformers,
random byte-level prompts are padded into the same [B, T] batches for every side. Each rep
runs jaxpod's forwards (`--forwards sharded,exact`: the sharded full-batch path and the exact
per-row path) and then the HF passes, so machine noise hits all of them. Rates count real
(non-pad) tokens and use the median batch time after a warm-up batch (the first jaxpod batch
compiles); tokens/s per host is the global rate / hosts. jaxpod's time covers barrier + forward + pull to host +
the wait for the previous batch's shard write + progress commit (written in a background
thread while the next forward runs; its busy time is reported too); HF's covers the forward
alone, at the faster of 1 and all-core torch threads. torch is imported only here.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import statistics
import tempfile
import time

import numpy as np

from jaxpod.bench.common import machine, print_table, write_json
from jaxpod.runtime.extras import require


@dataclasses.dataclass(frozen=True)
class BenchConfig:
  """Options of `jaxpod bench extract`."""

  hidden: int = 512  # model width
  layers: int = 8  # decoder blocks
  vocab: int = 1024  # vocabulary (>= 259 for the byte tokenizer)
  prompts: int = 96  # number of prompts
  batch_size: int = 16  # prompts per batch (every side)
  seq_len: int = 128  # max tokens per prompt
  capture: tuple[int, ...] = ()  # blocks to capture; () = middle and last
  points: tuple[str, ...] = ("resid",)  # capture points
  forwards: tuple[str, ...] = ("sharded", "exact")  # jaxpod capture forwards to time (extract.forward)
  repeats: int = 2  # jaxpod runs (fresh output folder each); HF passes over the prompts
  hosts: int = 1  # simulated hosts (the CLI relaunches itself under `jaxpod launch`)
  devices_per_host: int = 1  # fake CPU devices per simulated host
  json: str | None = None  # write the results here


def cli(cfg: BenchConfig) -> int:
  """Entry of `jaxpod bench extract` (with --hosts N > 1, on every host of the launch)."""
  options = dataclasses.asdict(cfg)
  run(json_path=options.pop("json"), **options)
  return 0


def _checkpoint(folder: str, cfg: BenchConfig):
  torch = require("torch", "the HF baseline of `jaxpod bench extract`")
  require("transformers", "the HF baseline of `jaxpod bench extract`")
  from transformers import LlamaConfig, LlamaForCausalLM
  torch.manual_seed(0)
  hf = LlamaForCausalLM(LlamaConfig(vocab_size=cfg.vocab, hidden_size=cfg.hidden, intermediate_size=cfg.hidden * 11 // 4,
                                    num_hidden_layers=cfg.layers, num_attention_heads=8, num_key_value_heads=4,
                                    max_position_embeddings=max(256, cfg.seq_len), bos_token_id=256, eos_token_id=257,
                                    pad_token_id=258)).eval()
  hf.save_pretrained(folder)
  return hf


def _prompts(path: str, n: int, seq_len: int) -> None:
  rng = np.random.default_rng(0)
  words = ["activation", "layer", "residual", "host", "shard", "mesh", "token", "batch", "the", "of", "a"]
  with open(path, "w") as f:
    for _ in range(n):
      size = int(rng.integers(seq_len // 3, seq_len + 16))  # some prompts get truncated
      text = " ".join(rng.choice(words, size))[:size]
      f.write(text + "\n")


def _hf_pass(hf, plan, cfg: BenchConfig) -> list[tuple[float, int]]:
  """(seconds, real tokens) per batch of one HF pass (forward with output_hidden_states=True)."""
  import torch
  out = []
  with torch.no_grad():
    for b in range(plan.num_batches(cfg.batch_size)):
      tokens, mask = plan.batch(b, cfg.batch_size)
      ids, am = torch.from_numpy(tokens).long(), torch.from_numpy(mask.astype(np.int64))
      t = time.perf_counter()
      hf(input_ids=ids, attention_mask=am, output_hidden_states=True)
      out.append((time.perf_counter() - t, int(mask.sum())))
  return out


def run(json_path: str | None = None, **overrides) -> dict:
  """Run the comparison on every host of the job (jaxpod and HF passes interleaved, so machine
  noise hits both; HF runs on the leader); the leader prints a rich table and writes JSON."""
  from jaxpod import extract, runtime
  cfg = BenchConfig(json=json_path, **overrides)
  host = runtime.init()
  layers = tuple(cfg.capture or sorted({cfg.layers // 2, cfg.layers - 1}))  # one block when they coincide
  tmp = runtime.broadcast(tempfile.mkdtemp(prefix="jaxpod-bench-extract-") if host.is_leader else None,
                          "bench.extract.folder")
  hf = _checkpoint(f"{tmp}/model", cfg) if host.is_leader else None
  if host.is_leader:
    _prompts(f"{tmp}/prompts.txt", cfg.prompts, cfg.seq_len)
  runtime.barrier("bench.extract.ready", 300)
  runs, hf_times, plan = [], {}, None
  try:
    for rep in range(cfg.repeats):
      for fwd in cfg.forwards:
        ecfg = extract.ExtractConfig(model=f"{tmp}/model", prompts=f"{tmp}/prompts.txt", layers=layers,
                                     out=f"{tmp}/out{rep}-{fwd}", points=cfg.points, batch_size=cfg.batch_size,
                                     max_seq_len=cfg.seq_len, progress=False, forward=fwd)
        runs.append(dict(extract.run(ecfg), forward=fwd))
      if host.is_leader:
        plan = plan or _plan_from(f"{tmp}/out0-{cfg.forwards[0]}")
        _hf_passes(hf, plan, cfg, hf_times, warmup=rep == 0)
      runtime.barrier("bench.extract.rep", 3600)  # the others wait while the leader times HF
    paired = _paired(cfg, f"{tmp}/model", layers, hf, plan, hf_times) if host.process_count == 1 else {}
  finally:
    runtime.barrier("bench.extract.end", 3600)
    if host.is_leader:
      shutil.rmtree(tmp, ignore_errors=True)
  return _report(cfg, layers, runs, hf_times, plan, host, paired) if host.is_leader else {}


def _paired(cfg: BenchConfig, model_dir: str, layers, hf, plan, hf_times: dict) -> dict[str, float]:
  """Forward alone, each batch run by every forward and HF (its faster thread count) back to back:
  the median over batches of each one's time / the first forward's (robust to a machine load that
  drifts between whole runs). One host only."""
  import jax
  import torch
  from jaxpod import extract, runtime
  from jaxpod.extract import forward as fwd_lib, sharded as sharded_lib
  from jaxpod.models.llama import hf_io
  hf_rates = {th: statistics.median(n / t for t, n in v) for th, v in hf_times.items()}
  torch.set_num_threads(max(hf_rates, key=hf_rates.get))
  mesh = runtime.make_mesh(jax.device_count(), 1, 1)
  calls = {}
  with jax.set_mesh(mesh):
    for fwd in cfg.forwards:
      ecfg = extract.ExtractConfig(model=model_dir, prompts="-", out="-", layers=layers, points=cfg.points,
                                   batch_size=cfg.batch_size, max_seq_len=cfg.seq_len, forward=fwd)
      cls = sharded_lib.ShardedForward if fwd == "sharded" else fwd_lib.Forward
      f = cls(hf_io.load(model_dir, mesh), mesh, ecfg)
      calls[fwd] = lambda tokens, mask, f=f: jax.block_until_ready(f(tokens, mask))

    def hf_call(tokens, mask):
      with torch.no_grad():
        hf(input_ids=torch.from_numpy(tokens).long(), attention_mask=torch.from_numpy(mask.astype(np.int64)),
           output_hidden_states=True)
    calls["hf"] = hf_call
    times = {k: [] for k in calls}
    for rep in range(cfg.repeats + 1):  # the first pass compiles / warms up
      for b in range(plan.num_batches(cfg.batch_size)):
        batch = plan.batch(b, cfg.batch_size)
        for k, call in calls.items():
          t = time.perf_counter()
          call(*batch)
          if rep:
            times[k].append(time.perf_counter() - t)
  first = cfg.forwards[0]
  return {k: statistics.median(a / b for a, b in zip(v, times[first])) for k, v in times.items()}


def _plan_from(url: str):
  """The padded batches jaxpod ran, read back from its dataset, for HF to run the same."""
  from jaxpod import extract
  from jaxpod.extract import engine
  ds = extract.open(url)
  return engine.Plan("", ds.seq_len, ds.mask.sum(1).astype(np.int32), ds.tokens)


def _hf_passes(hf, plan, cfg: BenchConfig, times: dict, warmup: bool) -> None:
  """One HF pass per torch thread count (1 and all cores: oversubscribed machines make many threads slower)."""
  import torch
  for n in sorted({1, os.cpu_count() or 1}):
    torch.set_num_threads(n)
    times.setdefault(n, []).extend(_hf_pass(hf, plan, cfg)[1 if warmup else 0:])


def _rate(runs: list[dict], tokens_per_batch: list[int]):
  """(median tokens/s, per-batch (phase seconds, tokens) after each run's compile batch, batch totals)."""
  ours = []
  for r in runs:
    ours += list(zip(r["batch_seconds"], tokens_per_batch))[1:]
  total = [sum(s.values()) for s, _ in ours]
  return statistics.median(n / t for (_, n), t in zip(ours, total)), ours, total


def _report(cfg: BenchConfig, layers, runs: list[dict], hf_times, plan, host, paired: dict) -> dict:
  tokens_per_batch = [int(plan.lengths[b * cfg.batch_size:(b + 1) * cfg.batch_size].sum())
                      for b in range(plan.num_batches(cfg.batch_size))]
  by_fwd = {f: _rate([r for r in runs if r["forward"] == f], tokens_per_batch) for f in cfg.forwards}
  main = cfg.forwards[0]  # the phase shares below are of this forward
  jax_rate, ours, total = by_fwd[main]
  runs = [r for r in runs if r["forward"] == main]
  hf_rates = {th: statistics.median(n / t for t, n in v) for th, v in hf_times.items()}
  best = max(hf_rates, key=hf_rates.get)
  hf_rate, hf_times = hf_rates[best], hf_times[best]
  phases = ("barrier", "forward", "pull", "write")
  # median over batches of each phase's share of its batch (robust to one host's late compile)
  share = {k: statistics.median(s.get(k, 0.0) / t for (s, _), t in zip(ours, total)) for k in phases}
  share_of_sum = {k: sum(s.get(k, 0.0) for s, _ in ours) / sum(total) for k in phases}
  overhead = statistics.median((s.get("barrier", 0) + s.get("pull", 0) + s.get("write", 0)) / t
                               for (s, _), t in zip(ours, total))
  busy = sum(r["write_busy_s"] for r in runs) / sum(sum(s.values()) for r in runs for s in r["batch_seconds"])
  rates = {f: v[0] for f, v in by_fwd.items()}
  results = {
      "forward": main, "jaxpod_tokens_per_s": jax_rate, "hf_tokens_per_s": hf_rate, "speedup": jax_rate / hf_rate,
      "tokens_per_s_by_forward": rates, "speedup_by_forward": {f: r / hf_rate for f, r in rates.items()},
      "tokens_per_s_per_host": {f: r / host.process_count for f, r in rates.items()},
      "hf_tokens_per_s_by_torch_threads": hf_rates, "hf_torch_threads": best,
      "median_batch_ms": {**{f: 1e3 * statistics.median(v[2]) for f, v in by_fwd.items()},
                          "hf": 1e3 * statistics.median(t for t, _ in hf_times)},
      "time_share_median": share, "time_share_of_total": share_of_sum, "barrier_plus_write_share": overhead,
      "write_thread_busy_share": busy,
      "paired_forward_time_ratio": paired,  # forward alone, batch by batch: time / the first forward's
      "goals": {"speedup_at_least_1.5x": jax_rate / hf_rate >= 1.5, "overhead_below_5pct": overhead < 0.05,
                **({"sharded_at_least_exact": rates["sharded"] >= rates["exact"]}
                   if {"sharded", "exact"} <= set(rates) else {})},
  }
  payload = {"benchmark": "extract", "config": dataclasses.asdict(cfg), "captured_layers": list(layers),
             "hosts": host.process_count, "mesh": runs[0]["mesh"],
             "batches_timed": {"jaxpod": len(ours), "hf": len(hf_times)}, "results": results,
             "machine": dict(machine(), load_average=os.getloadavg())}
  rows = [(f"jaxpod extract, {f} forward (forward+pull+write)", rates[f], 1e3 * statistics.median(by_fwd[f][2]),
           rates[f] / hf_rate) for f in cfg.forwards]
  rows.append((f"transformers output_hidden_states ({best} torch thread{'s' * (best > 1)})", hf_rate,
               results["median_batch_ms"]["hf"], 1.0))
  print_table(f"extraction, {cfg.layers} blocks x hidden {cfg.hidden}, batch {cfg.batch_size} x {plan.seq_len}, "
              f"{host.process_count} host(s) (jaxpod rate: host 0's batches; HF: one process)",
              ["kind", "tokens/s (median)", "batch ms (median)", "vs HF"], rows)
  if paired:
    print_table(f"forward alone, paired batch by batch (speed relative to {main}; > 1: faster)",
                ["kind", f"speed vs {main}"], [(k, 1 / v) for k, v in paired.items()])
  print_table(f"jaxpod time share per batch ({main} forward)", ["phase", "median share", "share of total"],
              [(k, share[k], share_of_sum[k]) for k in phases] +
              [("barrier+pull+write", overhead, 1 - share_of_sum["forward"]),
               ("(write thread busy, overlapped)", "", busy)])
  write_json(cfg.json, payload)
  return payload
