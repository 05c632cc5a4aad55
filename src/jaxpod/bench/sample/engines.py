"""The two child processes of `jaxpod bench sample`: jaxpod's engines ("jax") and HF generate ("hf").

    python -m jaxpod.bench.sample.engines jax|hf '<SampleBench as JSON>' MODEL_FOLDER

Each loads the model saved by the parent, compiles / warms up every engine it serves, prints
`READY`, then answers one command per stdin line with one `RESULT <json>` line:

  decode ENGINE         seconds of a full generate and of prefill + first token (decode workload)
  decode_tokens ENGINE  the greedy tokens of the decode workload
  rollout ENGINE        seconds and per-sample token counts of one rollout, plus engine statistics
  episodes L:ENV:MODE   one batch of multi-turn episodes, KV kept or re-prefilled (`rollout.episodes`)
  profile ENGINE        a traced rollout: the share of device time per category (`common.device_shares`)
  memcpy                memcpy bytes per second in this process (the roofline's bandwidth)

The parent interleaves the commands over both processes, so load drifts hit every engine alike
while torch's thread pool never runs beside XLA's (separate processes; OMP_WAIT_POLICY=PASSIVE).
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any

import numpy as np


def _timed(fn) -> float:
  t = time.perf_counter()
  fn()
  return time.perf_counter() - t


def memcpy_bytes_per_s(nbytes: int = 256 * 2**20, repeats: int = 5) -> float:
  """Median bytes copied per second by numpy's memcpy of a large buffer (the weight-streaming roofline)."""
  src = np.ones(nbytes // 4, np.float32)
  dst = np.empty_like(src)
  return nbytes / statistics.median(_timed(lambda: np.copyto(dst, src)) for _ in range(repeats))


def decode_tokens(opts) -> np.ndarray:
  return np.random.default_rng(0).integers(0, opts.vocab_size, (opts.batch_size, opts.prompt_len)).astype(np.int32)


def _jax_decode_engines(model, mesh, opts) -> dict[str, dict[str, Any]]:
  """Per jaxpod engine: full generate, prefill + first token (compiled here), greedy tokens."""
  import dataclasses
  import jax
  from flax import nnx
  from jaxpod.models.llama import stack
  from jaxpod.sample import EngineConfig, Sampler, SamplingParams, lockstep
  tokens = decode_tokens(opts)
  graphdef, params = nnx.split(stack.unstacked(model))  # the engine's form: a block per layer
  b, p = tokens.shape
  ec = EngineConfig(batch_size=b, max_prompt_len=p, max_new_tokens=opts.max_new_tokens,
                    min_prefill_len=opts.min_prefill_len)
  gen = lockstep.compiled_generate(ec, SamplingParams(), ())
  pre = jax.jit(lambda params, t, l: lockstep.prefill_only(graphdef, params, t, l, ec=ec))
  lengths, seeds = np.full((b,), p, np.int32), np.zeros((b,), np.uint32)
  engines = {"lockstep": {"full": lambda: np.asarray(gen(graphdef, params, tokens, lengths, seeds)[0]),
                          "first": lambda: np.asarray(pre(params, tokens, lengths).argmax(-1))}}
  rows, sd = tokens.tolist(), [0] * b
  for layout in opts.layouts:
    full = Sampler(model, mesh, dataclasses.replace(ec, kv_layout=layout), SamplingParams(), ())
    first = Sampler(model, mesh, dataclasses.replace(ec, kv_layout=layout, max_new_tokens=1), SamplingParams(), ())
    engines[f"continuous_{layout}"] = {"full": lambda s=full: np.asarray([c.tokens for c in s.generate(rows, sd)]),
                                       "first": lambda s=first: s.generate(rows, sd)}
  for e in engines.values():  # twice: compiles what this fixed workload runs (the second run starts where timed
    for _ in range(2):        # runs start: a slot sampler keeps the KV capacity the previous run ended with)
      e["tokens"] = e["full"]()
      e["first"]()
  return engines


def _hf_decode_engine(folder: str, opts) -> dict[str, Any]:
  """HF generate on the decode workload (greedy, exactly max_new_tokens)."""
  import torch
  from transformers import AutoModelForCausalLM  # any family's checkpoint
  model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
  ids = torch.from_numpy(decode_tokens(opts)).long()
  mask = torch.ones_like(ids)

  def gen(n):
    with torch.no_grad():
      return model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                            eos_token_id=None, pad_token_id=0)
  gen(2)
  return {"full": lambda: gen(opts.max_new_tokens), "first": lambda: gen(1),
          "tokens": gen(opts.max_new_tokens)[:, ids.shape[1]:].numpy()}


class Side:
  """The engines one child process serves, by workload."""

  def __init__(self, side: str, opts, folder: str):
    from jaxpod.bench.sample import rollout
    self.decode: dict[str, dict] = {}
    self.rollout: dict[str, dict] = {}
    if side == "hf":
      require_hf()
      if opts.threads:
        import torch
        torch.set_num_threads(opts.threads)
      if "decode" in opts.workloads:
        self.decode["hf_generate"] = _hf_decode_engine(folder, opts)
      if "rollout" in opts.workloads:
        self.rollout["hf_generate"] = rollout.hf(folder, opts)
      return
    import jax
    from jaxpod.models.llama import hf_io
    from jaxpod.runtime import make_mesh
    mesh = make_mesh(devices=jax.devices()[:1])
    model = hf_io.load(folder, mesh)
    if "decode" in opts.workloads:
      self.decode = _jax_decode_engines(model, mesh, opts)
    if "rollout" in opts.workloads:
      self.rollout = {f"continuous_{layout}": rollout.continuous(model, mesh, opts, layout) for layout in opts.layouts}
      self.rollout["lockstep"] = rollout.lockstep(model, opts)
    if "episodes" in opts.workloads:
      self.episodes = {layout: rollout.episodes(model, mesh, opts, layout) for layout in opts.layouts}

  def handle(self, cmd: str, name: str) -> Any:
    if cmd == "decode":
      e = self.decode[name]
      return {"full_s": _timed(e["full"]), "ttft_s": _timed(e["first"])}
    if cmd == "decode_tokens":
      return np.asarray(self.decode[name]["tokens"]).tolist()
    if cmd == "rollout":
      e = self.rollout[name]
      t = time.perf_counter()
      counts = e["run"]()
      return {"wall_s": time.perf_counter() - t, "counts": counts, "stats": e["stats"]()}
    if cmd == "episodes":  # layout:env:kept|whole
      layout, env, mode = name.split(":")
      return self.episodes[layout](env, mode == "kept")
    if cmd == "profile":
      from jaxpod.bench.common import device_shares
      e = self.rollout[name]
      return device_shares(e["run"], e["sampler"].runner.hlo)
    if cmd == "memcpy":
      return memcpy_bytes_per_s()
    raise ValueError(f"unknown bench command {cmd!r}")


def require_hf() -> None:
  from jaxpod.runtime.extras import require
  require("torch", "the HF baseline of `jaxpod bench sample`")
  require("transformers", "the HF baseline of `jaxpod bench sample`")


def main(argv: list[str]) -> int:
  from jaxpod.bench.sample.command import SampleBench
  side, fields, folder = argv[0], json.loads(argv[1]), argv[2]
  fields = {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}
  served = Side(side, SampleBench(**fields), folder)
  print("READY", flush=True)
  for line in sys.stdin:
    cmd, _, name = line.strip().partition(" ")
    if cmd == "quit":
      break
    print("RESULT " + json.dumps(served.handle(cmd, name)), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
