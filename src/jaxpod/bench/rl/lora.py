"""`python -m jaxpod.bench.rl.lora`: how the engine should run LoRA adapters, and what one version costs on the wire.

On the rl default policy and engine (`PolicyModelConfig`, `RolloutConfig`), with adapters of rank `--rank` on
every linear layer (B drawn non-zero, so they change the outputs), two engine modes:

  unmerged   the engine's programs take base + adapters and compute x W + s (x A) B every decode step; a new
             version swaps the adapter arrays in (`update_params`; the base arrays are the same objects)
  merged     one jitted program per version computes W + s A B for every targeted weight; the engine runs the
             plain model on that copy (the base is kept beside it to merge the next version)

Per mode: seconds per decode step (a whole-batch `generate` of max_new_tokens tokens, divided by them, median
of `--repeats`, the two modes interleaved), seconds per update (median), and the engine's extra weight bytes.
Beside them, the bytes of one adapter version published and fetched through `jaxpod.transfer` (checkpoint
mode, a local folder) against the whole model's. Prints a table and JSON (`--json PATH`).

`train_state_bytes(rl_args)`: the GRPO train state's bytes by part (params, Adam state, frozen buffers) of a
`jaxpod rl` command, from shapes alone; `jaxpod bench rl --lora-rank R` puts them beside each arm's peak memory.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time


def _ready(tree):
  import jax
  return jax.block_until_ready(jax.tree.leaves(tree))


def measure(rank: int = 1, repeats: int = 5, seed: int = 0) -> dict:
  """The figures of the module docstring, on this process's devices."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from flax import nnx
  from jaxpod.models.llama import init, lora
  from jaxpod.models.llama.lora import base_graphdef
  from jaxpod.policy.engine import make_sampler
  from jaxpod.policy.spec import PolicyModelConfig
  from jaxpod.rl.adapters import weights
  from jaxpod.rl.config import RolloutConfig
  from jaxpod.runtime import make_mesh
  from jaxpod.sample.layout import param_bytes
  llama, rollout = PolicyModelConfig().llama(), RolloutConfig()
  mesh = make_mesh(devices=jax.devices()[:1])
  lcfg = lora.LoraConfig(rank=rank, alpha=16.0)
  model = lora.attach(init(llama, seed=seed), lcfg, seed=seed, mesh=mesh)
  graphdef, adapters, base = nnx.split(model, nnx.LoRAParam, ...)
  rng = np.random.default_rng(seed)

  def version(k: int):  # another adapter version: same tree, shapes, shardings; B non-zero
    return jax.tree.map(lambda x: jax.device_put(jnp.asarray(rng.normal(0, 0.05, x.shape), x.dtype), x.sharding),
                        adapters)
  prompts = [[int(t) for t in rng.integers(0, 256, rollout.max_prompt_len)] for _ in range(rollout.batch_size)]
  seeds = list(range(len(prompts)))
  steps = rollout.max_new_tokens
  out = {"rank": rank, "device": jax.devices()[0].device_kind, "model_bytes": param_bytes(base),
         "adapter_bytes": param_bytes(adapters)}

  # unmerged: base + adapters in the engine's programs; merged: the plain model on W + s A B, merged per version
  plain = base_graphdef(llama)

  @jax.jit
  def merge(adapters, base):
    return nnx.state(lora.merged(nnx.merge(graphdef, weights(adapters, base))))
  engines = {"unmerged": (make_sampler(graphdef, weights(version(0), base), mesh, rollout, stop_ids=()),
                          lambda a: weights(a, base)),
             "merged": (make_sampler(plain, merge(version(0), base), mesh, rollout, stop_ids=()),
                        lambda a: merge(a, base))}
  versions = [version(k) for k in range(repeats + 1)]
  times = {mode: {"decode_step_s": [], "update_s": []} for mode in engines}
  for k, a in enumerate(versions):  # the modes interleaved: a shared machine's load drifts over both alike
    for mode, (sampler, to_engine) in engines.items():
      t = time.perf_counter()
      sampler.update_params(to_engine(a), k)
      _ready(sampler.runner.params)
      times[mode]["update_s"].append(time.perf_counter() - t)
      t = time.perf_counter()
      sampler.generate(prompts, seeds)
      times[mode]["decode_step_s"].append((time.perf_counter() - t) / steps)
  targeted = sum(x.size * x.dtype.itemsize for p, x in jax.tree_util.tree_flatten_with_path(base)[0]
                 if any(f"'{n}'" in jax.tree_util.keystr(p) for n in lcfg.target_modules))
  extra = {"unmerged": param_bytes(adapters), "merged": targeted}
  for mode in engines:  # the first round compiles: left out
    out[mode] = {k: statistics.median(v[1:]) for k, v in times[mode].items()} | {"extra_weight_bytes": extra[mode]}
  out["wire"] = _wire(adapters, base)
  return out


def _wire(adapters, full) -> dict:
  """Bytes and seconds of one adapter version published and fetched (checkpoint mode, local folder), vs the model."""
  from jaxpod.transfer import TransferConfig, create_client, create_server
  from jaxpod.transfer.flatten import abstract
  folder = tempfile.mkdtemp(prefix="jaxpod-rl-lora-")
  out = {}
  for what, tree in (("adapters", adapters), ("full", full)):
    cfg = TransferConfig(mode="checkpoint", coordinator="filesystem", folder=f"{folder}/{what}")
    with create_server(cfg) as server, create_client(cfg) as client:
      t = time.perf_counter()
      m = server.publish(1, tree)
      got = client.receive(abstract(tree), wait=30)
      out[what] = {"bytes": int(m.nbytes), "publish_fetch_s": time.perf_counter() - t,
                   "fetched": got is not None}
  out["fraction"] = out["adapters"]["bytes"] / out["full"]["bytes"]
  return out


def train_state_bytes(rl_args: list[str]) -> dict:
  """Bytes of the GRPO train state `jaxpod rl RL_ARGS` builds, from its abstract shapes (nothing allocated, no
  JAX start): `params` (what is trained: every weight, or the adapters), `opt_state` (Adam's mu and nu of those),
  `ema`, `buffers` (frozen: the KL reference copy, or LoRA's base) and `trained` = params + opt_state + ema, what
  LoRA shrinks. The run's starting checkpoint (`--model.hf`) must exist: its config.json sets the shapes."""
  import draccus
  import jax
  from jaxpod.rl.config import RLConfig
  from jaxpod.rl.grpo_task import GRPOTask
  from jaxpod.rl.run import grpo_config, policy_spec, run_dir
  from jaxpod.train import state as st
  cfg = draccus.parse(RLConfig, args=list(rl_args))
  folder = run_dir(cfg)
  tc = grpo_config(cfg, folder, policy_spec(cfg, folder))
  task = GRPOTask(tc, source=None)  # shapes only: no batch is drawn
  tx, _ = task.optimizer()
  state = st.abstract_state(st.make_init_fn(task, tx, 0, cfg.grpo.rows, ema=tc.trainer.ema > 0))
  size = lambda tree: sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))  # noqa: E731
  out = {k: size(getattr(state, k)) for k in ("params", "opt_state", "buffers")} | {"ema": size(state.ema_params)}
  return out | {"trained": out["params"] + out["opt_state"] + out["ema"]}


def main(argv=None) -> dict:
  """Entry: measure, print, write JSON."""
  import json
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--rank", type=int, default=1)
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--json", default=None)
  a = p.parse_args(argv)
  out = measure(a.rank, a.repeats)
  print(f"rl LoRA rank {a.rank} on {out['device']} (rl default policy and engine):")
  for mode in ("unmerged", "merged"):
    r = out[mode]
    print(f"  {mode:9s} decode step {1e3 * r['decode_step_s']:.3f} ms, update {1e3 * r['update_s']:.3f} ms, "
          f"extra engine weights {r['extra_weight_bytes'] / 1e6:.3f} MB")
  w = out["wire"]
  print(f"  wire: adapters {w['adapters']['bytes']} B vs full {w['full']['bytes']} B = {w['fraction']:.2%}; publish+"
        f"fetch {1e3 * w['adapters']['publish_fetch_s']:.1f} ms vs {1e3 * w['full']['publish_fetch_s']:.1f} ms")
  if a.json:
    with open(a.json, "w") as f:
      json.dump(out, f, indent=2)
  return out


if __name__ == "__main__":
  main()
