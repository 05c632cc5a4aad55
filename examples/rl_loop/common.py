"""The example's model: a bigram policy over a tiny vocabulary (logits W[prev, next])."""
from __future__ import annotations

import argparse

VOCAB = 16


def config_from_args(argv=None):
  """TransferConfig from the example's flags (shared by trainer and worker)."""
  from jaxpod.transfer import TransferConfig
  p = argparse.ArgumentParser()
  p.add_argument("--mode", default="arrow_flight")
  p.add_argument("--folder", default="/tmp/jaxpod_rl_loop")
  p.add_argument("--ray_address", default=None)
  p.add_argument("--steps", type=int, default=60)
  p.add_argument("--every", type=int, default=10)
  args = p.parse_args(argv)
  if args.ray_address:
    import ray
    ray.init(address=args.ray_address, namespace="rl_loop", log_to_driver=False)
  cfg = TransferConfig(mode=args.mode, name="rl_loop_policy", ray_namespace="rl_loop", folder=args.folder,
                       keep_n=2)
  return cfg, args


def like():
  """What the worker asks for: the policy's shapes on its own (single) device."""
  import jax
  import jax.numpy as jnp
  return {"policy": {"w": jax.ShapeDtypeStruct((VOCAB, VOCAB), jnp.float32)}}
