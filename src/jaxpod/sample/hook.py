"""`SampleHook`: sample from the model being trained, every N steps, without touching training.

A `jaxpod.runtime.hooks.Hook`: the trainer's loop calls it on every host at the same steps. It

  1. tokenizes the prompts once, on the leader, and broadcasts the ids (a tokenizer error
     raises on every host);
  2. waits for the training state (`block_until_ready` on the parameters it reads);
  3. runs the sampler with its own per-request seeds, in one of two modes:
       global      on the training mesh: the engine reshards the parameters once per call
                   into its inference layout (whole over data and fsdp, split over `model`;
                   a no-op when the trainer's layout is already that) so no decode step
                   gathers weights, and every host takes part in every request;
       replicated  one all-gather over the training mesh gives every device a full copy;
                   each host moves one copy onto its own devices and decodes its share of
                   the prompts alone (no cross-host traffic while decoding);
  4. blocks until the samples are on every host, then the leader appends them to
     `<run_dir>/samples.jsonl` with `weight_version = "step N"`.

It never writes to the state, never reads the data iterator and draws no randomness from
the trainer, and it has finished with the parameters before the loop dispatches the next
step (which donates them): the training trajectory is bit-identical with or without it
(invariant 6, tested in tests/sample/test_sample_hook.py).
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Sequence

import jax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from jaxpod import runtime
from jaxpod.runtime import storage
from jaxpod.models.llama.model import Llama
from jaxpod.models.llama.tokenizer import Tokenizer
from jaxpod.runtime.hooks import Hook, StepInfo
from jaxpod.runtime.mesh import MeshConfig, data_parallel
from jaxpod.runtime.sharding import state_shardings
from jaxpod.sample.config import MODES, SamplingOptions
from jaxpod.sample.sampler import Sampler, make_sample_mesh


def local_copy(params, mesh, local_mesh):
  """A full copy of `params` (sharded over `mesh`) on this host's `local_mesh`, laid out by the sharding rules."""
  whole = jax.jit(lambda p: p, out_shardings=NamedSharding(mesh, PartitionSpec()))(params)  # all-gather
  shardings = jax.tree.leaves(state_shardings(params, local_mesh))
  leaves, treedef = jax.tree.flatten(whole)
  return jax.tree.unflatten(treedef, [jax.device_put(x.addressable_data(0), sh) for x, sh in zip(leaves, shardings)])


class SampleHook(Hook):
  """Every `every` steps (and at the end): completions of `prompts` from the current parameters."""

  def __init__(self, every: int, prompts: Sequence[str], tokenizer: Tokenizer, graphdef,
               params_of: Callable[[Any], Any] = lambda state: state.params,
               options: SamplingOptions = SamplingOptions(batch_size=8, max_prompt_len=64, max_new_tokens=32),
               file_name: str = "samples.jsonl", mode: str = "global"):
    if mode not in MODES:
      raise ValueError(f"SampleHook mode={mode!r}; use one of {MODES}")
    self.every, self.prompts, self.tokenizer, self.graphdef = every, list(prompts), tokenizer, graphdef
    self.mode = mode
    self.params_of, self.options, self.file_name = params_of, options, file_name
    self.engine, self.sampling, self.seed = options.engine(), options.sampling(), options.seed
    self._ids: list[list[int]] | None = None
    self._sampler: Sampler | None = None
    self.history: list[tuple[int, list[str]]] = []  # (step, completions), on the leader

  def _prompt_ids(self) -> list[list[int]]:
    if self._ids is None:
      self._ids = runtime.broadcast_call(lambda: [self.tokenizer.encode(p) for p in self.prompts],
                                         "sample_hook.prompts")
    return self._ids

  def __call__(self, info: StepInfo) -> dict:
    ids = self._prompt_ids()
    params = self.params_of(info.state)
    jax.block_until_ready(params)
    mesh = info.mesh
    if self.mode == "replicated":
      mesh = make_sample_mesh("replicated", MeshConfig())
      params = local_copy(params, info.mesh, mesh)
    model: Llama = nnx.merge(self.graphdef, params)
    if self._sampler is None:
      self._sampler = Sampler(model, mesh, self.engine, self.sampling, self.tokenizer.eos_ids, mode=self.mode,
                              version=info.step)
    else:
      self._sampler.update_params(nnx.split(model)[1], version=info.step)
    seeds = [self.seed + i for i in range(len(ids))]
    results = self._sampler.generate(ids, seeds)  # blocks: the tokens are on every host when it returns
    if runtime.is_leader():
      texts = [self.tokenizer.decode(c.tokens) for c in results]
      self.history.append((info.step, texts))
      rows = [json.dumps({"step": info.step, "index": i, "prompt": p, "completion": text, "token_ids": c.tokens,
                          "finish_reason": c.finish_reason, "weight_version": f"step {info.step}"}) + "\n"
              for i, (p, text, c) in enumerate(zip(self.prompts, texts, results))]
      storage.append_text(storage.join(info.run_dir, self.file_name), "".join(rows))
    return {"sample/mean_new_tokens": sum(len(c.tokens) for c in results) / max(len(results), 1)}


def sample_hooks(task_cfg, tokenizer: Tokenizer, graphdef, mesh, **hook_kwargs) -> list:
  """[SampleHook] completing `task_cfg.prompts` every `task_cfg.sample_every` steps with `task_cfg.sample`'s options
  ([] without prompts): the task config of a Llama task of `jaxpod train`."""
  if not task_cfg.prompts:
    return []
  dp = data_parallel(mesh)
  rows = -(-len(task_cfg.prompts) // dp) * dp
  options = dataclasses.replace(task_cfg.sample, batch_size=rows)
  hook = SampleHook(task_cfg.sample_every, task_cfg.prompts, tokenizer, graphdef, options=options, **hook_kwargs)
  longest = max(len(ids) for ids in hook._prompt_ids())  # leader tokenizes, every host gets the ids: now
  if longest > options.max_prompt_len:                  # (before training), not at the first sampling step
    raise ValueError(f"task.prompts: a prompt has {longest} tokens but task.sample.max_prompt_len="
                     f"{options.max_prompt_len}; raise it or shorten the prompt")
  return [hook]
