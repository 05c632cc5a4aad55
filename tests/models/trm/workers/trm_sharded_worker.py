"""Two TRM training steps (grad + AdamATan2/SignSGD update) on a mesh, from the golden weights.

Imported by the single-process tests (`run_steps(mesh)`), and run as a script by the
multi-host test: `trm_sharded_worker.py OUT.npz DATA FSDP MODEL` (every host computes,
the leader writes OUT.npz).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

GOLDEN = Path(__file__).resolve().parents[3] / "data" / "golden" / "trm"  # tests/data/golden/trm
KEYS = ("logits", "q_halt_logits", "z_H", "z_L", "loss", "lm_head_grad", "qkv_grad", "puzzle_emb_grad",
        "lm_head_new", "puzzle_emb_new", "qkv_new", "steps", "halted")


def _place(x, sharding):
  import jax
  x = np.asarray(x)
  return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])


def run_steps(mesh, steps: int = 2) -> dict[str, np.ndarray]:
  """Global-batch train steps under `mesh`; every returned array is replicated then fetched."""
  import jax
  from flax import nnx
  from jax.sharding import NamedSharding, PartitionSpec as P
  from safetensors.numpy import load_file

  from jaxpod.models import trm
  from jaxpod.runtime import DEFAULT_RULES, state_shardings

  cfg = trm.TRMConfig.from_reference(json.loads((GOLDEN / "config.json").read_text())["model_config"])
  model = trm.load_reference_state_dict(str(GOLDEN / "weights.safetensors"), cfg)
  graphdef, params, buffers = trm.split_model(model)
  is_var = lambda v: isinstance(v, nnx.Variable)
  param_shardings = state_shardings(params, mesh)
  params = jax.tree.map(lambda v, s: v.replace(_place(v[...], s)), params, param_shardings, is_leaf=is_var)
  buffers = jax.tree.map(lambda v, s: v.replace(_place(v[...], s)), buffers, state_shardings(buffers, mesh),
                         is_leaf=is_var)
  batch_sharding = lambda nd: DEFAULT_RULES.sharding(mesh, ("batch",) + (None,) * (nd - 1))
  batch = {k: _place(v, batch_sharding(v.ndim)) for k, v in load_file(str(GOLDEN / "batch.safetensors")).items()}
  carry = jax.tree.map(lambda x: _place(x, batch_sharding(x.ndim)), trm.init_carry(cfg, 4))
  tx = trm.make_optimizer(trm.TRMOptimConfig(lr=1e-2, puzzle_emb_lr=1e-2, warmup_steps=1))
  opt_state = jax.jit(tx.init)(params)
  replicated = NamedSharding(mesh, P())

  def step(params, opt_state, carry, batch):
    grad_fn = jax.value_and_grad(trm.train_loss, argnums=1, has_aux=True)
    (_, (carry, outputs, metrics)), grads = grad_fn(graphdef, params, buffers, carry, batch, None)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = jax.tree.map(lambda p, u: p + u, params, updates)
    params = jax.tree.map(lambda v, s: v.replace(jax.lax.with_sharding_constraint(v[...], s)), params, param_shardings,
                          is_leaf=is_var)  # keep the FSDP layout across steps
    report = {"logits": outputs["logits"], "q_halt_logits": outputs["q_halt_logits"], "z_H": carry.z_H,
              "z_L": carry.z_L, "loss": metrics["loss"], "lm_head_grad": grads["lm_head"][...],
              "qkv_grad": grads["layers"][0]["self_attn"]["qkv"][...], "puzzle_emb_grad": grads["puzzle_emb"][...],
              "lm_head_new": params["lm_head"][...], "puzzle_emb_new": params["puzzle_emb"][...],
              "qkv_new": params["layers"][0]["self_attn"]["qkv"][...], "steps": carry.steps, "halted": carry.halted}
    return params, opt_state, carry, jax.lax.with_sharding_constraint(report, replicated)

  step = jax.jit(step, donate_argnums=(1,))
  out = {}
  with jax.set_mesh(mesh):
    for i in range(steps):
      params, opt_state, carry, report = step(params, opt_state, carry, batch)
      out.update({f"{k}/{i}": np.asarray(v) for k, v in report.items()})
  out["lm_head_shard_rows"] = np.array(params["lm_head"][...].addressable_shards[0].data.shape[0])
  return out


def main(argv):
  from jaxpod import runtime
  runtime.init(runtime.RuntimeConfig())
  from jaxpod.runtime import make_mesh
  out_path, data, fsdp, model = argv[0], *map(int, argv[1:4])
  mesh = make_mesh(data=data, fsdp=fsdp, model=model)
  result = run_steps(mesh)
  if runtime.is_leader():
    np.savez(out_path, **result)
  runtime.barrier("trm_worker.done", timeout_s=60)
  print("DONE", len(result), flush=True)
  runtime.shutdown()


if __name__ == "__main__":
  main(sys.argv[1:])
