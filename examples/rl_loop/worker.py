"""Inference worker process: before each sample, picks up the newest policy if there is one,
samples a sequence and logs which weight id produced it (and how often it follows the rule)."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from common import VOCAB, config_from_args, like
from jaxpod.transfer import create_client


@jax.jit
def sample(w, key):
  def step(tok, k):
    nxt = jax.random.categorical(k, w[tok])
    return nxt, nxt
  _, toks = jax.lax.scan(step, jnp.int32(0), jax.random.split(key, 12))
  return toks


def main() -> None:
  cfg, args = config_from_args()
  key, params, weight_id, i = jax.random.key(1), None, None, 0
  with create_client(cfg) as client:
    while weight_id != args.steps:
      update = client.receive(like(), wait=30.0 if params is None else 0.2)
      if update is not None:
        params, weight_id = update.params, update.weight_id
        m = update.metrics
        print(f"worker: received weight_id={weight_id} ({m.nbytes} bytes in {m.seconds * 1e3:.1f} ms)", flush=True)
      if params is None:
        raise SystemExit("worker: no weights published within 30 s")
      key, sub = jax.random.split(key)
      toks = sample(params["policy"]["w"], sub)
      follows = float(jnp.mean(toks[1:] == (toks[:-1] + 1) % VOCAB))
      print(f"worker: sample {i} used weight_id={weight_id} follows_rule={follows:.2f}", flush=True)
      i += 1


if __name__ == "__main__":
  main()
