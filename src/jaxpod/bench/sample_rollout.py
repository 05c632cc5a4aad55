"""The RL-rollout part of `jaxpod bench sample` (issue 14): (b) throughput, (c) KV memory, slot occupancy.

Workload (fixed by the options, the same for every engine): `rollout_prompts` random prompts
of `rollout_min_prompt`..`rollout_max_prompt` tokens, `rollout_n` samples each at
temperature 1, at most `rollout_max_new` new tokens. A random model's next-token
distribution is nearly uniform, so a stop set of vocab/`rollout_mean_len` ids ends a
completion with probability ~1/rollout_mean_len per token: lengths spread geometrically up
to the cap, as RL rollouts do. Engines, all at `rollout_slots` rows:

  continuous   jaxpod's continuous engine (slots, paged KV, n samples sharing the prefill)
  lockstep     jaxpod's lock-step engine: chunks of `rollout_slots` rows (each prompt n times)
               that run until their longest row stops
  hf_generate  HF `generate`, left-padded batches of slots/n prompts with num_return_sequences=n

Throughput is generated tokens (stop tokens included) per second of wall time; each engine
draws its own samples (same distribution, not the same tokens), so token counts are reported.
"""
from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np


def workload(opts) -> tuple[list[list[int]], list[int], tuple[int, ...]]:
  """(prompts, seeds, stop ids) of the rollout, fixed by the options."""
  rng = np.random.default_rng(1)
  lengths = rng.integers(opts.rollout_min_prompt, opts.rollout_max_prompt + 1, opts.rollout_prompts)
  stops = opts.vocab_size // opts.rollout_mean_len
  prompts = [rng.integers(0, opts.vocab_size - stops, n).tolist() for n in lengths]
  return prompts, list(range(len(prompts))), tuple(range(opts.vocab_size - stops, opts.vocab_size))


def _engine_config(opts, **kw):
  from jaxpod.sample import EngineConfig
  return EngineConfig(batch_size=opts.rollout_slots, max_prompt_len=opts.rollout_max_prompt,
                      max_new_tokens=opts.rollout_max_new, **kw)


def _continuous(model, mesh, opts, prompts, seeds, stops) -> dict[str, Any]:
  from jaxpod.sample import Sampler, SamplingParams
  ec = _engine_config(opts, prefill_batch=opts.rollout_prefill_batch, page_size=opts.rollout_page_size,
                      kv_layout="paged")
  s = Sampler(model, mesh, ec, SamplingParams(1.0), stops)
  s.warmup(opts.rollout_n)

  def go():
    out = s.generate(prompts, seeds, n=opts.rollout_n)
    return [len(c.sampled) for c in out]
  return {"run": go, "sampler": s}


def _lockstep(model, opts, prompts, seeds, stops) -> dict[str, Any]:
  from flax import nnx
  from jaxpod.sample import SamplingParams, engine
  ec = _engine_config(opts)
  fn = engine.compiled_generate(ec, SamplingParams(1.0), tuple(sorted(stops)))
  graphdef, params = nnx.split(model)
  rows = [(p, s * opts.rollout_n + j) for p, s in zip(prompts, seeds) for j in range(opts.rollout_n)]

  def go(rows=rows):
    counts = []
    for c in range(0, len(rows), ec.batch_size):
      chunk = rows[c:c + ec.batch_size]
      tokens = np.zeros((ec.batch_size, ec.max_prompt_len), np.int32)
      lengths, sd = np.ones((ec.batch_size,), np.int32), np.zeros((ec.batch_size,), np.uint32)
      for r, (p, seed) in enumerate(chunk):
        tokens[r, :len(p)], lengths[r], sd[r] = p, len(p), seed
      out = np.asarray(fn(graphdef, params, tokens, lengths, sd)[0])
      counts += [int((out[r] != engine.NO_TOKEN).sum()) for r in range(len(chunk))]
    return counts
  return {"run": go, "warm": lambda: go(rows[:1])}  # every chunk has the same shape: one compile


def _hf(folder, opts, prompts, stops) -> dict[str, Any]:
  import torch
  from transformers import LlamaForCausalLM
  model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
  per = max(1, opts.rollout_slots // opts.rollout_n)
  stop_set, pad = set(stops), 0

  def go():
    counts = []
    for c in range(0, len(prompts), per):
      chunk = prompts[c:c + per]
      width = max(len(p) for p in chunk)
      ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk])
      mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
      with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                             max_new_tokens=opts.rollout_max_new, num_return_sequences=opts.rollout_n,
                             eos_token_id=list(stops), pad_token_id=pad)
      for row in out[:, width:].tolist():
        n = next((i + 1 for i, t in enumerate(row) if t in stop_set), len(row))
        counts.append(n)
    return counts
  return {"run": go}


def compare_rollout(folder: str, opts) -> dict[str, Any]:
  """In this process: the three engines on the rollout, interleaved; tok/s, lengths, KV memory, occupancy."""
  import jax
  from jaxpod.models.llama import KVCache, PagedKVCache, hf_io
  from jaxpod.runtime import make_mesh
  prompts, seeds, stops = workload(opts)
  mesh = make_mesh(devices=jax.devices()[:1])
  model = hf_io.load(folder, mesh)
  engines = {"continuous": _continuous(model, mesh, opts, prompts, seeds, stops),
             "lockstep": _lockstep(model, opts, prompts, seeds, stops), "hf_generate": _hf(folder, opts, prompts, stops)}
  engines["lockstep"]["warm"]()  # compile (untimed); the continuous engine was warmed up
  times = {k: [] for k in engines}
  counts: dict[str, list[int]] = {}
  for _ in range(opts.rollout_repeats):
    for name, e in engines.items():
      t = time.perf_counter()
      counts[name] = e["run"]()
      times[name].append(time.perf_counter() - t)
  results = {}
  for name, t in times.items():
    c = counts[name]
    results[name] = {"generate_s": statistics.median(t), "tokens": sum(c),
                     "tok_s": sum(c) / statistics.median(t), "len_min": min(c), "len_median": statistics.median(c),
                     "len_max": max(c)}
  for name in ("continuous", "lockstep"):
    results[name]["vs_hf"] = results[name]["tok_s"] / results["hf_generate"]["tok_s"]
  results["continuous"]["vs_lockstep"] = results["continuous"]["tok_s"] / results["lockstep"]["tok_s"]
  s = engines["continuous"]["sampler"]
  cfg, ec = model.cfg, s.ec
  memory = {"static_bytes": KVCache.nbytes(cfg, ec.batch_size, ec.cache_len),
            "paged_peak_bytes": s.last.pool.peak_used * PagedKVCache.page_bytes(cfg, ec.page_size),
            "peak_pages": s.last.pool.peak_used, "page_size": ec.page_size}
  memory["static_over_paged"] = memory["static_bytes"] / max(memory["paged_peak_bytes"], 1)
  return {"results": results, "kv_memory": memory, "occupancy": s.last.occupancy, "slots": ec.batch_size,
          "preemptions": s.last.preemptions, "rounds": s.last.rounds}


def plot_occupancy(occupancy: list, slots: int, path: str) -> None:
  """Slot occupancy over time (one point per decode round) as a PNG."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  t = [o[0] for o in occupancy]
  live = [o[1] for o in occupancy]
  fig, ax = plt.subplots(figsize=(8, 3))
  ax.step(t, live, where="post")
  ax.axhline(slots, color="gray", linestyle=":", label=f"{slots} slots")
  ax.set_xlabel("seconds")
  ax.set_ylabel("live slots")
  ax.set_ylim(0, slots + 1)
  ax.set_title(f"continuous engine: slot occupancy (mean {np.mean(live) / slots:.0%})")
  ax.legend(loc="lower left")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
