"""The RL-rollout workload of `jaxpod bench sample` and its runner per engine; the occupancy plot; the episodes
workload (`--workloads [episodes]`: multi-turn episodes with the KV kept across turns vs re-prefilled, `episodes`).

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

import time
from typing import Any

import numpy as np

from jaxpod.bench.common import Synthetic, print_table


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
           "rounds": sch.rounds, "decode_steps": sch.decode_steps, "preemptions": sch.preemptions,
           "device_s": box.get("device_s", 0.0),
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
      out["rows_computed"] = float(np.mean(sch.row_counts)) / ec.batch_size if sch.row_counts else 0.0
    out["static_kv_bytes"] = ec.batch_size * ec.cache_len * per_position
    return out
  return {"run": run, "stats": stats, "sampler": s}


def lockstep(model, opts) -> dict[str, Any]:
  """Run / stats of the lock-step engine: chunks of rollout_slots rows, each prompt n times."""
  from flax import nnx
  from jaxpod.models.llama import stack
  from jaxpod.sample import SamplingParams, lockstep
  prompts, seeds, stops = workload(opts)
  ec = engine_config(opts)
  fn = lockstep.compiled_generate(ec, SamplingParams(1.0), tuple(sorted(stops)))
  graphdef, params = nnx.split(stack.unstacked(model))  # the engine's form: a block per layer
  rows = [(p, s * opts.rollout_n + j) for p, s in zip(prompts, seeds) for j in range(opts.rollout_n)]

  box: dict = {}

  def run(rows=rows):
    counts, steps = [], 0
    for c in range(0, len(rows), ec.batch_size):
      chunk = rows[c:c + ec.batch_size]
      tokens = np.zeros((ec.batch_size, ec.max_prompt_len), np.int32)
      lengths, sd = np.ones((ec.batch_size,), np.int32), np.zeros((ec.batch_size,), np.uint32)
      for r, (p, seed) in enumerate(chunk):
        tokens[r, :len(p)], lengths[r], sd[r] = p, len(p), seed
      out = np.asarray(fn(graphdef, params, tokens, lengths, sd)[0])
      counts += [int((out[r] != lockstep.NO_TOKEN).sum()) for r in range(len(chunk))]
      steps += max(counts[c:]) - 1  # the chunk decodes until its longest row ends (its first token is prefill's)
    box["decode_steps"] = steps
    return counts

  chunks = -(-len(rows) // ec.batch_size)
  prompt_tokens = sum(len(p) for p, _ in rows)

  def stats():
    return {"decode_steps": box.get("decode_steps", 0), "prefill_real_per_prompt_token": 1.0,
            "prefill_computed_per_prompt_token": chunks * ec.batch_size * ec.max_prompt_len / prompt_tokens}
  run(rows[:1])  # compile (every chunk has the same shape)
  return {"run": run, "stats": stats}


def hf(folder, opts) -> dict[str, Any]:
  """Run / stats of HF generate: batches of slots/n prompts, left-padded, num_return_sequences=n."""
  import torch
  from transformers import AutoModelForCausalLM  # any family's checkpoint
  prompts, _, stops = workload(opts)
  model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
  per = max(1, opts.rollout_slots // opts.rollout_n)
  stop_set, pad = set(stops), 0
  computed = [0, 0]  # prompt token rows prefilled, decode steps

  def run():
    counts = []
    computed[:] = [0, 0]
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
      computed[1] += out.shape[1] - width - 1  # generate stops once every row ended; its first token is prefill's
      for row in out[:, width:].tolist():
        counts.append(next((i + 1 for i, t in enumerate(row) if t in stop_set), len(row)))
    return counts

  def stats():
    prompt_tokens = sum(len(p) for p in prompts) * opts.rollout_n
    return {"decode_steps": computed[1], "prefill_real_per_prompt_token": 1.0,
            "prefill_computed_per_prompt_token": computed[0] / prompt_tokens}
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


# -- episodes: the KV kept across turns vs every turn re-prefilled ---------------------------------------------
EPISODE_PROBLEMS, EPISODE_N, EPISODE_MAX_NEW, EPISODE_MEAN_TURN = 4, 4, 16, 12  # 16 episodes, turns of ~12 tokens
EPISODE_ENVS = {"calculator": (3, 64), "synthetic": (6, 224)}  # environment -> (max turns, max_prompt_len)


class CalculatorShapes:
  """The calculator's episode shapes under a random policy: its prompts ("Compute a*b.\\n"), its tool's `= value`
  observation after every turn (as if each turn were `calc: a*b`: a random model never writes `calc:` itself),
  its 3 turns at most (configs/rl_calculator.yaml)."""

  def reset(self, problem):
    self.answer = problem.answer
    return problem.prompt

  def step(self, completion):
    return f"= {self.answer}\n", 0.0, False


def episodes(model, mesh, opts, layout: str):
  """`run(env, keep) -> stats` of one batch of episodes (EPISODE_PROBLEMS x EPISODE_N) of `env` on the continuous
  engine with `layout`, the KV kept across turns or every turn re-prefilled (same seeds: the same episodes)."""
  import hashlib
  from jaxpod.models.llama import ByteTokenizer
  from jaxpod.problems.base import Problem
  from jaxpod.problems.calculator import calculator_problem
  from jaxpod.policy.rollout.episodes import run_episodes
  from jaxpod.sample import EngineConfig, Sampler, SamplingParams
  rng, tok = np.random.default_rng(2), ByteTokenizer()
  problems = {"calculator": [Problem(*calculator_problem(rng, 4), 0, i) for i in range(EPISODE_PROBLEMS)],
              "synthetic": [Problem(f"Synthetic task {i:03d}: go on.\n", "", 0, i) for i in range(EPISODE_PROBLEMS)]}
  factories = {"calculator": CalculatorShapes, "synthetic": Synthetic}
  stops = tuple(range(opts.vocab_size - opts.vocab_size // EPISODE_MEAN_TURN, opts.vocab_size))
  samplers = {env: Sampler(model, mesh, EngineConfig(
      batch_size=opts.rollout_slots, kv_layout=layout, max_prompt_len=plen, max_new_tokens=EPISODE_MAX_NEW,
      page_size=opts.rollout_page_size, min_prefill_len=opts.min_prefill_len),  # prefill and extend: all rows at once
      SamplingParams(1.0), stops) for env, (_, plen) in EPISODE_ENVS.items()}

  def run(env: str, keep: bool) -> dict:
    s, (turns, plen) = samplers[env], EPISODE_ENVS[env]
    t = time.perf_counter()  # the Sampler driven round by round: `s.last` is the whole batch's schedule
    got = [e for g in run_episodes(s, tok, factories[env], problems[env], EPISODE_N, turns, seed=0,
                                   max_context=plen, keep_kv=keep) for e in g]
    wall = time.perf_counter() - t
    count = {"real": s.last.prefill_prompt_tokens, "computed": s.last.prefill_tokens}
    k = len(got)
    return {"wall_s": wall, "episodes": k, "turns": sum(e.turns for e in got) / k,
            "distinct_per_episode": sum(len(e.context()) for e in got) / k,
            "prefill_real_per_episode": count["real"] / k, "prefill_computed_per_episode": count["computed"] / k,
            "digest": hashlib.sha256(repr([(e.tokens, e.versions) for e in got]).encode()).hexdigest()[:12]}
  return run


def episodes_report(opts, ask) -> dict:
  """Interleaved timed episode batches (`ask(name) -> stats`, name = layout:env:kept|whole) after one untimed batch
  each (compiles); medians of `opts.repeats`; the table."""
  import statistics
  names = [f"{layout}:{env}:{mode}" for layout in opts.layouts for env in EPISODE_ENVS for mode in ("kept", "whole")]
  for name in names:
    ask(name)
  runs: dict[str, list] = {n: [] for n in names}
  for r in range(opts.repeats):
    for name in names[r % len(names):] + names[:r % len(names)]:
      runs[name].append(ask(name))
  out: dict = {}
  for name, rs in runs.items():
    out[name] = dict(rs[-1], wall_s=statistics.median(x["wall_s"] for x in rs))
  rows = []
  for layout in opts.layouts:
    for env in EPISODE_ENVS:
      kept, whole = out[f"{layout}:{env}:kept"], out[f"{layout}:{env}:whole"]
      kept["vs_whole"] = whole["wall_s"] / kept["wall_s"]
      kept["same_episodes"] = kept["digest"] == whole["digest"]
      for mode, r in (("kept", kept), ("whole", whole)):
        rows.append((layout, env, mode, f"{r['turns']:.1f}", f"{r['distinct_per_episode']:.0f}",
                     f"{r['prefill_real_per_episode']:.0f}", f"{r['prefill_real_per_episode'] / r['distinct_per_episode']:.2f}",
                     f"{r['prefill_computed_per_episode']:.0f}", r["wall_s"],
                     f"{r['vs_whole']:.2f}x" if mode == "kept" else "-",
                     ("yes" if r["same_episodes"] else "NO") if mode == "kept" else "-"))
  print_table(f"episodes: {EPISODE_PROBLEMS} problems x n={EPISODE_N}, turns of <= {EPISODE_MAX_NEW} tokens (stop "
              f"chance 1/{EPISODE_MEAN_TURN}), {opts.rollout_slots} slots; prefill tokens per episode (real; / the "
              f"episode's distinct tokens; computed incl. padding), seconds per episode batch (medians of "
              f"{opts.repeats}, interleaved); kept = KV kept across turns, whole = every turn re-prefilled",
              ["layout", "env", "KV", "turns", "distinct", "prefill", "/ distinct", "computed", "batch s",
               "speed-up", "same episodes"], rows)
  return out
