"""Worker for the multi-host sampling tests:
`python sample_worker.py SCENARIOS CKPT PROMPTS OUT_DIR BAD_CKPT [FAMILY_CKPT]`.

SCENARIOS is a comma list, run in order in the same processes (one launch serves several tests):
  modes  `jaxpod.sample.run` in global then replicated mode; the leader writes OUT_DIR/<mode>.jsonl
  fail   a broken tokenizer on the leader, an oversized config, then a prompt file that differs on
         host 1; prints `FAIL <case> <json>` on every host, which must all get there (no hang)
  hook   trains the tiny Llama 6 steps without, then with a SampleHook every 2 steps in global, then in
         replicated mode; prints `LOSSES <plain|hook|hook_replicated> <hex of the float32 losses>`;
         samples go to OUT_DIR/<hook|hook_replicated>.jsonl
  family `jaxpod.sample.run` of FAMILY_CKPT (a sliding-window family), greedy, global mode, to OUT_DIR/family.jsonl
"""
import dataclasses
import functools
import json
import sys

import jax
import numpy as np

from jaxpod import runtime

scenarios, ckpt, prompts, out_dir, bad_ckpt = sys.argv[1].split(","), *sys.argv[2:6]
family_ckpt = sys.argv[6] if len(sys.argv) > 6 else None
host = runtime.init(runtime.RuntimeConfig(control_timeout_s=90))

from jaxpod.runtime import MeshConfig, make_mesh  # noqa: E402
from jaxpod.sample import SampleConfig, SamplingOptions, run  # noqa: E402

BASE = SampleConfig(hf=ckpt, prompts=prompts, out=f"{out_dir}/x.jsonl", batch_size=4, max_prompt_len=32,
                    max_new_tokens=8, temperature=0.8, top_k=20, top_p=0.9, seed=11, n=2, page_size=4)
GLOBAL_MESH = MeshConfig(data=2, model=2) if jax.device_count() == 4 else MeshConfig(data=-1)


def fail(case, cfg):
  try:
    run(cfg)
    print(f"FAIL {case} none", flush=True)
  except Exception as e:  # noqa: BLE001 - reported for the test
    print(f"FAIL {case} {json.dumps({'type': type(e).__name__, 'message': str(e)})}", flush=True)


@functools.cache
def _tiny_lm_trainer():
  """(config, mesh, graphdef, shardings, optimizer, jitted step): built once, so the three trainings of `hook` run
  the same compiled step, as one trainer does between its hooks (each would otherwise compile it twice)."""
  import optax
  from flax import nnx
  from jaxpod.models.llama import abstract, tiny
  from jaxpod.models.llama.loss import loss_and_grad
  from jaxpod.runtime import state_shardings
  cfg = tiny(bos_token_id=256, eos_token_id=(257,), pad_token_id=258)
  mesh = make_mesh(data=2, model=-1)
  graphdef, abs_params = nnx.split(abstract(cfg))
  tx, grad_fn = optax.adam(3e-3), loss_and_grad(graphdef)

  def step(params, opt_state, tokens):
    (loss, _), grads = grad_fn(params, tokens)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  return cfg, mesh, graphdef, state_shardings(abs_params, mesh), tx, jax.jit(step, donate_argnums=(0, 1))


def train_tiny_lm(hooks, steps=6, b=8, t=32):
  """Adam on byte windows of a text; hooks called as the trainer calls them. Returns float32 losses."""
  from flax import nnx
  from jaxpod.models.llama import init
  from jaxpod.train.hooks import StepInfo, run_hooks
  text = ("the quick brown fox jumps over the lazy dog. " * 40).encode()
  cfg, mesh, graphdef, shardings, tx, step_fn = _tiny_lm_trainer()
  params = nnx.split(init(cfg, seed=0, shardings=shardings))[1]
  opt_state = tx.init(params)

  class State:  # what the hook reads: state.params
    def __init__(self, params):
      self.params = params

  losses = []
  with jax.set_mesh(mesh):
    for i in range(1, steps + 1):
      starts = np.random.default_rng(i).integers(0, len(text) - t, b)
      rows = np.stack([np.frombuffer(text[s:s + t], np.uint8) for s in starts]).astype(np.int32)
      sh = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
      params, opt_state, loss = step_fn(params, opt_state, jax.make_array_from_callback(rows.shape, sh,
                                                                                        lambda idx: rows[idx]))
      losses.append(loss)
      run_hooks(hooks, StepInfo(step=i, state=State(params), final=i == steps, run_dir=out_dir, mesh=mesh))
  return graphdef, np.asarray([np.asarray(x) for x in losses], np.float32)


for scenario in scenarios:
  if scenario == "modes":
    run(dataclasses.replace(BASE, mode="global", out=f"{out_dir}/global.jsonl", mesh=GLOBAL_MESH))
    run(dataclasses.replace(BASE, mode="replicated", out=f"{out_dir}/replicated.jsonl"))
  elif scenario == "family":
    run(dataclasses.replace(BASE, hf=family_ckpt, mode="global", out=f"{out_dir}/family.jsonl", mesh=GLOBAL_MESH,
                            temperature=0.0, n=1))
  elif scenario == "fail":
    fail("tokenizer", dataclasses.replace(BASE, hf=bad_ckpt))
    fail("memory", dataclasses.replace(BASE, batch_size=4096, max_new_tokens=1_000_000))  # TBs of KV cache
    mine = f"{out_dir}/prompts_{host.process_index}.txt"  # host 1's copy of the prompt file differs
    with open(mine, "w") as f:
      f.write("same first line\n" + ("" if host.process_index == 0 else "a line only host 1 has\n"))
    fail("prompts", dataclasses.replace(BASE, prompts=mine))
  elif scenario == "hook":
    from jaxpod.models.llama import ByteTokenizer
    from jaxpod.sample.hook import SampleHook
    graphdef, plain = train_tiny_lm([])
    print("LOSSES plain", plain.tobytes().hex(), flush=True)
    for mode, name in (("global", "hook"), ("replicated", "hook_replicated")):
      hook = SampleHook(every=2, prompts=["the quick", "lazy", "fox", "over the"], tokenizer=ByteTokenizer(),
                        graphdef=graphdef, options=SamplingOptions(batch_size=2, max_prompt_len=16, max_new_tokens=8),
                        mode=mode, file_name=f"{name}.jsonl")
      _, with_hook = train_tiny_lm([hook])
      print(f"LOSSES {name}", with_hook.tobytes().hex(), flush=True)
  runtime.barrier(f"sample_worker.{scenario}", 60)
  print(f"DONE {scenario}", flush=True)
runtime.shutdown()
