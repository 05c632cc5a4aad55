"""LoRA in `jaxpod rl` (`--lora.rank N`): GRPO trains adapters only, and only adapters go on the wire.

The trainer's state holds the adapters (`nnx.LoRAParam`: the params, the only gradients and Adam state)
and the frozen base (its buffers, stored once). Everything that needs the whole policy merges the two
halves on the fly (`weights`): the rollout engine, the held-out evaluator, the HF export.

  KL reference   GRPO's `beta > 0` reference is the base with the adapters off: the base state run through
                 the plain (adapter-free) graph (`reference`); no second copy of the weights exists.
  publishing     the disaggregated trainer publishes its params, i.e. the adapters alone, over whatever
                 transport `transfer.mode` names (the pieces are the LoRAParam leaves; ~1% of the model's
                 bytes at rank 1 on the rl default). A worker loads the base once from the run's starting
                 checkpoint (`model.hf` or the warm-up's export) and swaps each version's adapters in
                 (`EngineWeights`): the engine's programs take the base and the adapters as arguments,
                 same tree and shapes every version, so a swap compiles nothing.
  engine         unmerged: the engine computes x W + s (x A) B every decode step (`model.adapted`). The
                 alternative, merging W + s A B once per version, needs a second copy of every targeted
                 weight on the sampler and a merge program per version; `python -m jaxpod.bench.rl.lora`
                 measures both (docs/lora.md, "RL: only adapters on the wire").
  export         `<run>/hf` is the merged model (a plain HF checkpoint, `hf_io.save` merges), `<run>/adapter`
                 the adapters as PEFT's files (`LlamaTask.export_hooks`, as every LoRA task).
The KL reference (the base with the adapters off) is every Llama task's: `LlamaTask.reference`.
"""
from __future__ import annotations

from jaxpod.models.llama.config import LlamaConfig
from jaxpod.models.llama.lora import LoraConfig
from jaxpod.runtime import storage


def weights(params, buffers):
  """The whole policy's state from a LoRA train state's halves (adapters + frozen base)."""
  from flax import nnx
  return nnx.merge_state(buffers, params)


def adapter_like(llama: LlamaConfig, lcfg: LoraConfig, mesh):
  """(graphdef of the adapted model, ShapeDtypeStructs of its adapters with `mesh`'s shardings): what a worker
  receives each version."""
  import jax
  from flax import nnx
  from jaxpod.models.llama import lora
  from jaxpod.models.llama import model as model_lib
  from jaxpod.runtime.sharding import state_shardings
  model = nnx.eval_shape(lambda: lora.attach(model_lib.Llama(llama, rngs=nnx.Rngs(params=0)), lcfg, traced=True))
  graphdef, adapters, _ = nnx.split(model, nnx.LoRAParam, ...)
  leaves, treedef = jax.tree.flatten(adapters)
  shardings = jax.tree.leaves(state_shardings(adapters, mesh))
  return graphdef, jax.tree.unflatten(treedef, [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s)
                                                for a, s in zip(leaves, shardings)])


class EngineWeights:
  """A worker's policy state: the base loaded once from `base_url` (placed on `mesh`), each version's adapters
  merged in as state (no copy of the base, no arithmetic)."""

  def __init__(self, base_url: str, llama: LlamaConfig, mesh):
    self.base_url, self.llama, self.mesh = base_url, llama, mesh
    self.base = None

  def __call__(self, adapters):
    if self.base is None:
      from flax import nnx
      from jaxpod.models.llama import hf_io
      if not storage.exists(storage.join(self.base_url, "config.json")):
        raise FileNotFoundError(f"rl.lora: the base checkpoint {self.base_url} is missing (the trainer writes the "
                                "warm-up's export there before its first publish); check model.hf or the run folder")
      self.base = nnx.state(hf_io.load(self.base_url, self.mesh, cfg=self.llama))
    return weights(adapters, self.base)


class AdapterClient:
  """A transfer client whose updates carry the whole policy: each received version's adapters merged into the
  base (`EngineWeights`); what a rollout worker hands its engine. Everything else is the wrapped client's."""

  def __init__(self, client, merge: EngineWeights):
    self.client, self.merge = client, merge

  def receive(self, like, wait: float | None = None):
    import dataclasses
    update = self.client.receive(like, wait=wait)
    return None if update is None else dataclasses.replace(update, params=self.merge(update.params))

  def __getattr__(self, name):
    return getattr(self.client, name)


def worker_side(policy, llama: LlamaConfig, mesh, client):
  """(graphdef, like, client) of a LoRA rollout worker: it receives adapters only, and its engine gets them on
  the base it loaded once (the policy's starting checkpoint)."""
  graphdef, like = adapter_like(llama, policy.lora.adapters(), mesh)
  return graphdef, like, AdapterClient(client, EngineWeights(policy.start_from, llama, mesh))
