"""The RL-rollout workload of `jaxpod bench sample` and its runner per engine; the occupancy plot.

Workload (fixed by the options, the same for every engine): `rollout_prompts` random prompts
of `rollout_min_prompt`..`rollout_max_prompt` tokens, `rollout_n` samples each at
temperature 1, at most `rollout_max_new` new tokens. A random model's next-token
distribution is nearly uniform, so a stop set of vocab/`rollout_mean_len` ids ends a
completion with probability ~1/rollout_mean_len per token: lengths spread geometrically up
to the cap, as RL rollouts do. Engines, all at `rollout_slots` rows:

  continuous_<layout>  jaxpod's continuous engine (n samples of a prompt share its prefill)
  lockstep             jaxpod's lock-step engine: chunks of `rollout_slots` rows (each prompt n
                       times, padded to rollout_max_prompt) that run until their longest row stops
  hf_generate          HF `generate`, left-padded batches of slots/n prompts with num_return_sequences=n

Throughput is generated tokens (stop tokens included) per second of wall time; each engine
draws its own samples (same distribution, not the same tokens), so token counts are reported.
Prefill work is reported per prompt token of the samples (a prompt counts n times): `real`
counts the prompt tokens prefilled (1/n when a prompt is prefilled once per group),
`computed` the token rows the programs ran (padding included).
"""
from __future__ import annotations

from typing import Any

import numpy as np


def workload(opts) -> tuple[list[list[int]], list[int], tuple[int, ...]]:
  """(prompts, seeds, stop ids) of the rollout, fixed by the options."""
  rng = np.random.default_rng(1)
  lengths = rng.integers(opts.rollout_min_prompt, opts.rollout_max_prompt + 1, opts.rollout_prompts)
  stops = opts.vocab_size // opts.rollout_mean_len
  prompts = [rng.integers(0, opts.vocab_size - stops, n).tolist() for n in lengths]
  return prompts, list(range(len(prompts))), tuple(range(opts.vocab_size - stops, opts.vocab_size))


def engine_config(opts, **kw):
  from jaxpod.sample import EngineConfig
  return EngineConfig(batch_size=opts.rollout_slots, max_prompt_len=opts.rollout_max_prompt,
                      max_new_tokens=opts.rollout_max_new, min_prefill_len=opts.min_prefill_len, **kw)


def continuous(model, mesh, opts, layout: str) -> dict[str, Any]:
  """Run / stats of the continuous engine with `layout` (compiled ahead of time, HLO kept for the profile)."""
  from jaxpod.sample import Sampler, SamplingParams
  prompts, seeds, stops = workload(opts)
  ec = engine_config(opts, kv_layout=layout, prefill_batch=opts.rollout_prefill_batch,
                     page_size=opts.rollout_page_size)
  s = Sampler(model, mesh, ec, SamplingParams(1.0), stops)
  s.runner.hlo = []
  s.warmup()
  box: dict = {}

  def run():
    device0 = s.runner.device_s
    out = s.generate(prompts, seeds, n=opts.rollout_n)
    box["device_s"] = s.runner.device_s - device0
    return [len(c.sampled) for c in out]

  def stats() -> dict[str, Any]:
    sch, cfg = s.last, model.cfg
    occ = [o for _, o in sch.occupancy]
    out = {"occupancy": sch.occupancy, "mean_occupancy": float(np.mean(occ)) / ec.batch_size if occ else 0.0,
           "rounds": sch.rounds, "preemptions": sch.preemptions, "device_s": box.get("device_s", 0.0),
           "prefill_real_per_prompt_token": sch.prefill_prompt_tokens / max(sch.sample_prompt_tokens, 1),
           "prefill_computed_per_prompt_token": sch.prefill_tokens / max(sch.sample_prompt_tokens, 1)}
    per_position = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim_ * np.dtype(cfg.dtype).itemsize
    if layout == "paged":
      from jaxpod.models.llama import PagedKVCache
      out["kv_peak_bytes"] = sch.pool.peak_used * PagedKVCache.page_bytes(cfg, ec.page_size)
      out["peak_pages"] = sch.pool.peak_used
    else:
      out["kv_peak_bytes"] = max(sch.capacities, default=0) * ec.batch_size * per_position
      out["capacities"] = {str(c): sch.capacities.count(c) for c in sorted(set(sch.capacities))}
      out["resizes"] = s.runner.resizes
    out["static_kv_bytes"] = ec.batch_size * ec.cache_len * per_position
    return out
  return {"run": run, "stats": stats, "sampler": s}


def lockstep(model, opts) -> dict[str, Any]:
  """Run / stats of the lock-step engine: chunks of rollout_slots rows, each prompt n times."""
  from flax import nnx
  from jaxpod.sample import SamplingParams, lockstep
  prompts, seeds, stops = workload(opts)
  ec = engine_config(opts)
  fn = lockstep.compiled_generate(ec, SamplingParams(1.0), tuple(sorted(stops)))
  graphdef, params = nnx.split(model)
  rows = [(p, s * opts.rollout_n + j) for p, s in zip(prompts, seeds) for j in range(opts.rollout_n)]

  def run(rows=rows):
    counts = []
    for c in range(0, len(rows), ec.batch_size):
      chunk = rows[c:c + ec.batch_size]
      tokens = np.zeros((ec.batch_size, ec.max_prompt_len), np.int32)
      lengths, sd = np.ones((ec.batch_size,), np.int32), np.zeros((ec.batch_size,), np.uint32)
      for r, (p, seed) in enumerate(chunk):
        tokens[r, :len(p)], lengths[r], sd[r] = p, len(p), seed
      out = np.asarray(fn(graphdef, params, tokens, lengths, sd)[0])
      counts += [int((out[r] != lockstep.NO_TOKEN).sum()) for r in range(len(chunk))]
    return counts

  chunks = -(-len(rows) // ec.batch_size)
  prompt_tokens = sum(len(p) for p, _ in rows)

  def stats():
    return {"prefill_real_per_prompt_token": 1.0,
            "prefill_computed_per_prompt_token": chunks * ec.batch_size * ec.max_prompt_len / prompt_tokens}
  run(rows[:1])  # compile (every chunk has the same shape)
  return {"run": run, "stats": stats}


def hf(folder, opts) -> dict[str, Any]:
  """Run / stats of HF generate: batches of slots/n prompts, left-padded, num_return_sequences=n."""
  import torch
  from transformers import LlamaForCausalLM
  prompts, _, stops = workload(opts)
  model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
  per = max(1, opts.rollout_slots // opts.rollout_n)
  stop_set, pad = set(stops), 0
  computed = [0]

  def run():
    counts = []
    computed[0] = 0
    for c in range(0, len(prompts), per):
      chunk = prompts[c:c + per]
      width = max(len(p) for p in chunk)
      ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk])
      mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
      computed[0] += len(chunk) * opts.rollout_n * width  # generate expands the prompts n times before prefill
      with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                             max_new_tokens=opts.rollout_max_new, num_return_sequences=opts.rollout_n,
                             eos_token_id=list(stops), pad_token_id=pad)
      for row in out[:, width:].tolist():
        counts.append(next((i + 1 for i, t in enumerate(row) if t in stop_set), len(row)))
    return counts

  def stats():
    prompt_tokens = sum(len(p) for p in prompts) * opts.rollout_n
    return {"prefill_real_per_prompt_token": 1.0, "prefill_computed_per_prompt_token": computed[0] / prompt_tokens}
  return {"run": run, "stats": stats}


def plot_occupancy(occupancy: list, slots: int, path: str, title: str) -> None:
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
  ax.set_title(f"{title}: slot occupancy (mean {np.mean(live) / slots:.0%})" if live else title)
  ax.legend(loc="lower left")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
