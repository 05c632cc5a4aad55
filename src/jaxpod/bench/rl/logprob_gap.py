"""The sampler-trainer log-prob gap that `grpo.tis` / `grpo.mis` correct (docs/rl.md, off-policy corrections).

    python -m jaxpod.bench.rl.logprob_gap 1b --prompts 64 --tokens 256     # the docs' H100 figures
    python -m jaxpod.bench.rl.logprob_gap small --prompts 8 --tokens 16    # a CPU smoke run

mu (the engine's per-token log-probs: KV cache, one token a step) against pi (`grpo.token_logprobs` of one
full-sequence forward, as GRPO's train step computes it) on the same weights, in float32 and bfloat16, on this
machine's first device. Random init with the LM head scaled so that the logits have std `--logit-std` (6: a mean
token entropy of ~2 nats, unlike a random model's near-uniform one). Prints one JSON line per dtype and writes
`--json`. A measurement, not a test: on CPU both dtypes' numerics differ from an accelerator's.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

SHAPES = {
    "small": dict(hidden_size=256, intermediate_size=704, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=4, vocab_size=4096),
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=32000),
}
PROMPT_LEN = 32


def scaled_head(params, factor: float):
  """`params` with the LM head times `factor` (a peaked next-token distribution from a random model)."""
  from flax import nnx
  flat = dict(nnx.to_flat_state(params))
  key = next(k for k in flat if "lm_head" in "/".join(map(str, k)))
  flat[key] = flat[key].replace(flat[key].get_value() * factor)
  return nnx.from_flat_state(list(flat.items()))


def gap(size: str, dtype: str, prompts: int, tokens: int, logit_std: float) -> dict:
  """Sample `prompts` x `tokens` at temperature 1 and compare the engine's log-probs with a full forward's."""
  import jax
  import jax.numpy as jnp
  from flax import nnx
  from jaxpod.models.llama.config import LlamaConfig
  from jaxpod.models.llama.model import forward, init
  from jaxpod.rl.grpo import token_logprobs
  from jaxpod.runtime.mesh import make_mesh
  from jaxpod.sample import Sampler
  from jaxpod.sample.config import EngineConfig, SamplingParams
  shapes = SHAPES[size]
  cfg = LlamaConfig(**shapes, dtype=dtype, max_position_embeddings=PROMPT_LEN + tokens + 8)
  graphdef, params = nnx.split(init(cfg, seed=0))
  params = scaled_head(params, logit_std / (0.02 * shapes["hidden_size"] ** 0.5))
  ec = EngineConfig(batch_size=prompts, max_prompt_len=PROMPT_LEN, max_new_tokens=tokens, steps_per_round=16)
  sp = SamplingParams(temperature=1.0)
  sampler = Sampler(nnx.merge(graphdef, params), make_mesh(data=-1), ec, sp, stop_ids=(cfg.vocab_size + 7,))
  rng = np.random.default_rng(1)
  ids = [list(rng.integers(3, cfg.vocab_size, PROMPT_LEN)) for _ in range(prompts)]
  t = time.perf_counter()
  outs = sampler.generate(ids, list(range(prompts)))  # no stop id in the vocabulary: every row has `tokens`
  seconds = time.perf_counter() - t
  rows = np.array([p + list(c.sampled) for p, c in zip(ids, outs)], np.int32)
  mu = np.array([c.logprobs for c in outs], np.float32)
  fn = jax.jit(lambda p, r: token_logprobs(forward(graphdef, p, r[:, :-1]).logits, r[:, 1:], sp))
  pi = np.asarray(fn(params, jnp.asarray(rows)))[:, PROMPT_LEN - 1:]
  logits = forward(graphdef, params, jnp.asarray(rows[:4, :-1])).logits.astype(jnp.float32)
  entropy = float(-(jax.nn.softmax(logits) * jax.nn.log_softmax(logits)).sum(-1).mean())
  d = pi - mu
  ratio, seq = np.exp(d), np.exp(d.sum(1))
  return {"mean_abs_gap": float(np.abs(d).mean()), "max_abs_gap": float(np.abs(d).max()),
          "ratio_p01_p50_p99": [float(np.percentile(ratio, q)) for q in (1, 50, 99)],
          "frac_ratio_outside_0.5_2": float(((ratio < 0.5) | (ratio > 2)).mean()),
          "frac_ratio_outside_0.8_1.25": float(((ratio < 0.8) | (ratio > 1.25)).mean()),
          "seq_ratio_p01_p50_p99": [float(np.percentile(seq, q)) for q in (1, 50, 99)],
          "mean_token_entropy_nats": entropy, "generate_s": seconds}


def main(argv=None) -> dict:
  """Both dtypes on one size; the JSON written to --json."""
  import jax
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("size", nargs="?", default="small", choices=sorted(SHAPES))
  ap.add_argument("--prompts", type=int, default=64)
  ap.add_argument("--tokens", type=int, default=256)
  ap.add_argument("--logit-std", type=float, default=6.0)
  ap.add_argument("--json", default="logprob_gap.json")
  a = ap.parse_args(argv)
  out = {"device": str(jax.devices()[0].device_kind), "jax": jax.__version__, "size": a.size,
         "prompts": a.prompts, "tokens": a.tokens}
  for dtype in ("float32", "bfloat16"):
    out[dtype] = gap(a.size, dtype, a.prompts, a.tokens, a.logit_std)
    print(dtype, json.dumps(out[dtype]), flush=True)
  with open(a.json, "w") as f:
    json.dump(out, f, indent=1)
  return out


if __name__ == "__main__":
  main()
