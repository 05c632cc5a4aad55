"""`jaxpod bench sample [--json PATH]`: jaxpod's sampler vs HF `generate` (torch CPU), same run.

Same random model (saved once in HF layout and loaded by both), same prompts, greedy, no
stop tokens (every row generates exactly max_new_tokens). Reported per engine, medians of
`repeats` timed runs after one untimed warm-up (which includes jaxpod's compile):
  ttft_s          time to first token of the batch (prefill + first token)
  prefill_tok_s   batch * prompt_len / ttft
  decode_tok_s    batch * (max_new_tokens - 1) / (full generate time - ttft)
The baseline is HF; `decode_vs_hf` is jaxpod's decode tok/s over HF's.
torch and transformers are imported inside `run` only.
"""
from __future__ import annotations

import dataclasses
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
  json: str | None = None  # write the results here


def _median_time(fn, repeats: int) -> float:
  fn()  # warm-up (compile for jaxpod)
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t)
  return statistics.median(times)


def _jaxpod_times(folder: str, tokens: np.ndarray, opts: SampleBench) -> dict[str, float]:
  import jax
  from flax import nnx
  from jaxpod.models.llama import hf_io
  from jaxpod.runtime import make_mesh
  from jaxpod.sample import EngineConfig, SamplingParams, engine
  mesh = make_mesh(devices=jax.devices()[:1])
  model = hf_io.load(folder, mesh)
  b, p = tokens.shape
  ec = EngineConfig(batch_size=b, max_prompt_len=p, max_new_tokens=opts.max_new_tokens)
  graphdef, params = nnx.split(model)
  gen = engine.compiled_generate(ec, SamplingParams(), ())
  pre = jax.jit(lambda params, t, l: engine.prefill_only(graphdef, params, t, l, ec=ec))
  lengths = np.full((b,), p, np.int32)
  seeds = np.zeros((b,), np.uint32)
  full = _median_time(lambda: np.asarray(gen(graphdef, params, tokens, lengths, seeds)), opts.repeats)
  ttft = _median_time(lambda: np.asarray(pre(params, tokens, lengths).argmax(-1)), opts.repeats)
  out = np.asarray(gen(graphdef, params, tokens, lengths, seeds))
  if (out < 0).any():
    raise RuntimeError("jaxpod stopped early; the benchmark needs every row to run max_new_tokens")
  return {"full_s": full, "ttft_s": ttft}


def _hf_times(folder: str, tokens: np.ndarray, opts: SampleBench) -> dict[str, Any]:
  import torch
  from transformers import LlamaForCausalLM
  model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
  ids = torch.from_numpy(tokens).long()
  mask = torch.ones_like(ids)

  def gen(n):
    with torch.no_grad():
      return model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                            eos_token_id=None, pad_token_id=0)
  full = _median_time(lambda: gen(opts.max_new_tokens), opts.repeats)
  ttft = _median_time(lambda: gen(1), opts.repeats)
  return {"full_s": full, "ttft_s": ttft, "torch_threads": torch.get_num_threads(),
          "tokens": gen(opts.max_new_tokens)[:, tokens.shape[1]:].numpy()}


def _rates(t: dict[str, float], opts: SampleBench) -> dict[str, float]:
  b, p, n = opts.batch_size, opts.prompt_len, opts.max_new_tokens
  decode_s = max(t["full_s"] - t["ttft_s"], 1e-9)
  return {"ttft_s": t["ttft_s"], "prefill_tok_s": b * p / t["ttft_s"], "decode_tok_s": b * (n - 1) / decode_s,
          "generate_s": t["full_s"]}


def run(json_path: str | None = None, **overrides) -> dict:
  """Time both engines on one model and one prompt batch; print a rich table, write JSON."""
  from jaxpod.models.llama import LlamaConfig, hf_io, init
  opts = dataclasses.replace(SampleBench(json=json_path), **overrides)
  cfg = LlamaConfig(vocab_size=opts.vocab_size, hidden_size=opts.hidden_size,
                    intermediate_size=opts.intermediate_size, num_hidden_layers=opts.num_layers,
                    num_attention_heads=opts.num_heads, num_key_value_heads=opts.num_kv_heads,
                    rms_norm_eps=1e-5, max_position_embeddings=4096, eos_token_id=())
  tokens = np.random.default_rng(0).integers(0, opts.vocab_size, (opts.batch_size, opts.prompt_len)).astype(np.int32)
  with tempfile.TemporaryDirectory(prefix="jaxpod-bench-sample-") as folder:
    hf_io.save(init(cfg, seed=0), folder)
    hf = _hf_times(folder, tokens, opts)
    jp = _jaxpod_times(folder, tokens, opts)
  results = {"jaxpod": _rates(jp, opts), "hf_generate": _rates(hf, opts)}
  results["jaxpod"]["decode_vs_hf"] = results["jaxpod"]["decode_tok_s"] / results["hf_generate"]["decode_tok_s"]
  payload = {"benchmark": "sample", "baseline": "hf_generate", "options": dataclasses.asdict(opts),
             "params": cfg.num_params(), "torch_threads": hf["torch_threads"], "results": results,
             "machine": machine()}
  rows = [(k, v["decode_tok_s"], v["prefill_tok_s"], v["ttft_s"] * 1e3, v["generate_s"]) for k, v in results.items()]
  print_table(f"sample: {cfg.num_params() / 1e6:.0f}M params, batch {opts.batch_size}, prompt {opts.prompt_len}, "
              f"{opts.max_new_tokens} new tokens (medians of {opts.repeats})",
              ["engine", "decode tok/s", "prefill tok/s", "TTFT ms", "generate s"], rows)
  write_json(json_path, payload)
  return payload


def cli(argv: list[str]) -> int:
  """`jaxpod bench sample [--json PATH] [--batch-size N] ...` (one process)."""
  from jaxpod.cli.args import parse
  opts = parse(SampleBench, argv, "jaxpod bench sample")
  run(json_path=opts.json, **{k: v for k, v in dataclasses.asdict(opts).items() if k != "json"})
  return 0
