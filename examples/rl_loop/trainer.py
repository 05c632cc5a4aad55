"""Trainer process: learns "next token = previous + 1" and publishes the policy every N steps."""
from __future__ import annotations

import sys
import time

import jax
import jax.numpy as jnp

from common import VOCAB, config_from_args
from jaxpod.transfer import PublishWeightsHook, create_server


def loss_fn(params, prev, nxt):
  logits = params["policy"]["w"][prev]  # [B, V]
  return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(prev.shape[0]), nxt])


@jax.jit
def train_step(params, prev):
  loss, grads = jax.value_and_grad(loss_fn)(params, prev, (prev + 1) % VOCAB)
  return jax.tree_util.tree_map(lambda p, g: p - 2.0 * g, params, grads), loss


def main() -> None:
  cfg, args = config_from_args()
  params = {"policy": {"w": jnp.zeros((VOCAB, VOCAB), jnp.float32)}}
  hook = PublishWeightsHook(create_server(cfg), every=args.every)
  key = jax.random.key(0)
  for step in range(1, args.steps + 1):
    key, sub = jax.random.split(key)
    params, loss = train_step(params, jax.random.randint(sub, (64,), 0, VOCAB))
    if hook(step, params):
      print(f"trainer: published weight_id={step} loss={float(loss):.3f}", flush=True)
    time.sleep(0.05)  # stand-in for a real step's compute, so the worker sees several versions
  sys.stdin.read()  # keep serving until run.py closes stdin (the worker is done)
  hook.close()


if __name__ == "__main__":
  main()
