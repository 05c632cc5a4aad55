"""Worker for the SampleHook test: `python hook_worker.py RUN_DIR`.

Trains the tiny Llama on a byte-level text for 6 steps twice, without and with a SampleHook
every 2 steps, and prints `LOSSES <mode> <hex of the float32 losses>` so the test can compare
the two trajectories bit for bit.
"""
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxpod import runtime

run_dir = sys.argv[1]
runtime.init(runtime.RuntimeConfig(control_timeout_s=90))

from jaxpod.models.llama import ByteTokenizer, abstract, init, tiny  # noqa: E402
from jaxpod.models.llama.loss import loss_and_grad  # noqa: E402
from jaxpod.runtime import make_mesh, state_shardings  # noqa: E402
from jaxpod.sample import EngineConfig  # noqa: E402
from jaxpod.sample.hook import SampleHook  # noqa: E402
from jaxpod.train.hooks import StepInfo, run_hooks  # noqa: E402

TEXT = ("the quick brown fox jumps over the lazy dog. " * 40).encode()
B, T, STEPS = 8, 32, 6
cfg = tiny(bos_token_id=256, eos_token_id=(257,), pad_token_id=258)
mesh = make_mesh(data=2, model=2)
graphdef, abs_params = nnx.split(abstract(cfg))
shardings = state_shardings(abs_params, mesh)
tok = ByteTokenizer()
tx = optax.adam(3e-3)
grad_fn = loss_and_grad(graphdef)


@jax.jit
def step(params, opt_state, tokens):
  (loss, _), grads = grad_fn(params, tokens)
  updates, opt_state = tx.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, loss


def batch(i):
  starts = np.random.default_rng(i).integers(0, len(TEXT) - T, B)
  rows = np.stack([np.frombuffer(TEXT[s:s + T], np.uint8) for s in starts]).astype(np.int32)
  sh = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
  return jax.make_array_from_callback(rows.shape, sh, lambda idx: rows[idx])


class State:
  def __init__(self, params):
    self.params = params


def train(hooks):
  params = nnx.split(init(cfg, seed=0, shardings=shardings))[1]
  opt_state = tx.init(params)
  losses = []
  with jax.set_mesh(mesh):
    step_fn = jax.jit(step.__wrapped__, donate_argnums=(0, 1))
    for i in range(1, STEPS + 1):
      params, opt_state, loss = step_fn(params, opt_state, batch(i))
      losses.append(loss)
      info = StepInfo(step=i, state=State(params), final=i == STEPS, run_dir=run_dir, mesh=mesh)
      run_hooks(hooks, info)
  return np.asarray([np.asarray(x) for x in losses], np.float32)


plain = train([])
hook = SampleHook(every=2, prompts=["the quick", "lazy"], tokenizer=tok, graphdef=graphdef,
                  engine=EngineConfig(batch_size=2, max_prompt_len=16, max_new_tokens=8))
with_hook = train([hook])
print("LOSSES plain", plain.tobytes().hex(), flush=True)
print("LOSSES hook", with_hook.tobytes().hex(), flush=True)
print("SAMPLED", len(hook.history) if runtime.is_leader() else -1, flush=True)
runtime.barrier("hook_worker.end", 60)
runtime.shutdown()
