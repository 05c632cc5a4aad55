"""What every trainer task of a Llama policy shares: build, load, export (causal_lm, preference and the policy's
own tasks: the warm-up, GRPO).

    class MyTask(LlamaTask):                     # a `jaxpod.train.task.Task` of a Llama policy
      def __init__(self, cfg):
        self.llama, self.start_url = LlamaConfig(...), "gs://bucket/ckpt"   # None: random init
    hooks = task.export_hooks(graphdef, "gs://bucket/out")                 # HF checkpoint at the final step
                                                      # (LoRA: merged, and the adapters as PEFT's files)

`LlamaTask` gives the trainer the model (`abstract_model`, `init_model`), the starting checkpoint placed like
the trainer's params (`initial_params`), `_buffers(params)`: what a task keeps beside the params (a frozen
reference copy; none by default), the frozen reference (`reference`: that copy, or with LoRA the base with the
adapters off) and the optimizer at LoRA's learning-rate rule (`optimizer_for`, `policy.lora`). `AdamWConfig` is
the optimizer section of the Llama tasks of `jaxpod train`; `byte_llama` their byte-level default architecture.
"""
from __future__ import annotations

import dataclasses

from typing import Callable

from jaxpod.models.llama.config import LlamaConfig
from jaxpod.policy.lora import LoraSection, adapted_optimizer
from jaxpod.runtime.hooks import Hook, StepInfo


def byte_llama() -> LlamaConfig:
  """The default causal-LM Llama: byte-level vocabulary (259), hidden 128, 4 layers, 512 positions."""
  return LlamaConfig(vocab_size=259, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                     num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
                     tie_word_embeddings=True, bos_token_id=256, eos_token_id=(257,), pad_token_id=258)


@dataclasses.dataclass(frozen=True)
class AdamWConfig:
  """AdamW (b1 0.9, b2 0.95) with linear warmup, cosine decay to trainer.steps and global-norm clipping."""

  lr: float = 3e-3  # peak learning rate
  warmup_steps: int = 50  # linear warmup from 0
  lr_min_ratio: float = 0.1  # cosine decay to lr * lr_min_ratio at trainer.steps
  weight_decay: float = 0.01  # decoupled weight decay (not on norm weights)
  grad_clip: float = 1.0  # global-norm clip (0: none)
  moment_dtype: str = ""  # Adam moments and update math: "" the params' dtype | float32 (bf16 weights, f32 moments)

  def __post_init__(self):
    if self.lr <= 0 or self.warmup_steps < 0 or self.weight_decay < 0 or self.grad_clip < 0:
      raise ValueError("task.optim.lr must be > 0 and task.optim.warmup_steps, weight_decay, grad_clip >= 0")
    if not 0.0 <= self.lr_min_ratio <= 1.0:
      raise ValueError(f"task.optim.lr_min_ratio={self.lr_min_ratio}: expected a value in [0, 1]")
    if self.moment_dtype not in ("", "float32"):
      raise ValueError(f"task.optim.moment_dtype={self.moment_dtype!r}: use float32 (or leave it unset: the params')")

  def build(self, steps: int, lr: float | None = None):
    """(optax transformation, lr schedule) for a run of `steps` optimizer steps, peaking at `lr` (None: self.lr)."""
    import optax
    from jaxpod.models.llama.model import weight_decay_mask
    lr = self.lr if lr is None else lr
    sched = optax.warmup_cosine_decay_schedule(0.0, lr, self.warmup_steps, steps, end_value=lr * self.lr_min_ratio)
    adamw = optax.adamw(sched, b1=0.9, b2=0.95, weight_decay=self.weight_decay, mask=weight_decay_mask)
    if self.moment_dtype == "float32":
      from jaxpod.train.optim import float32_moments
      adamw = float32_moments(adamw)
    return (optax.chain(optax.clip_by_global_norm(self.grad_clip), adamw) if self.grad_clip else adamw), sched


class HFExportHook(Hook):
  """At the final step, write the policy as a HF checkpoint (every host takes part; the leader writes)."""

  def __init__(self, graphdef, url: str):
    self.graphdef, self.url = graphdef, url

  def due(self, step: int, final: bool) -> bool:
    return final

  def __call__(self, info: StepInfo) -> None:
    from flax import nnx
    from jaxpod.models.llama import hf_io
    hf_io.save(nnx.merge(self.graphdef, info.state.params), self.url)
    return None


class AdapterExportHook(Hook):
  """At the final step, a LoRA run's evaluated (EMA) adapters as PEFT's files at `adapter_url` (None:
  `<run>/adapter`) and, with `hf_url`, the merged policy as a plain HF checkpoint there (every host takes
  part; the leader writes). `weights(params, buffers)` is the whole model's state: the task's `weights`."""

  def __init__(self, graphdef, weights, base_model: str, adapter_url: str | None = None, hf_url: str | None = None):
    self.graphdef, self.weights, self.base_model = graphdef, weights, base_model
    self.adapter_url, self.hf_url = adapter_url, hf_url

  def due(self, step: int, final: bool) -> bool:
    return final

  def __call__(self, info: StepInfo) -> None:
    from flax import nnx
    from jaxpod.models.llama import hf_io, peft_io
    from jaxpod.runtime import storage
    model = nnx.merge(self.graphdef, self.weights(info.state.eval_params, info.state.buffers))
    if self.hf_url:
      hf_io.save(model, self.hf_url)  # merges W + s A B: a plain HF checkpoint
    peft_io.save_adapter(model, self.adapter_url or storage.join(info.run_dir, "adapter"), base_model=self.base_model)
    return None


class LlamaTask:
  """The Llama side of a trainer task: `llama` (the architecture) and `start_url` (a HF checkpoint; None: random
  init) are set by the subclass, and with `lora` (a `LoraSection`) the state's params are the adapters and its
  buffers the frozen base, stored once (`adapter`: a PEFT folder whose adapters start the run). Hooks a task
  may override: `_buffers` (what the state keeps beside the params), `_model` (a random model), `_split` (trained
  params vs frozen buffers), `_loaded` (what a task adds to the loaded checkpoint) and `_place` (params and
  buffers placed like the state's). Needs `self.cfg` (the TrainConfig) with LoRA."""

  llama: LlamaConfig
  start_url: str | None = None
  lora: LoraSection | None = None  # train adapters only, the base frozen in the buffers; None: every weight is trained
  adapter: str = ""  # PEFT folder whose adapters start the run (with lora; "": fresh adapters)
  _plain = None  # LoRA: the adapter-free graphdef (a reference runs the base through it)

  def _buffers(self, params) -> dict:
    return {}

  def optimizer_for(self, lr: float, build: Callable[[float], tuple]) -> tuple:
    """(optax transformation, lr schedule) of `build(peak lr)` at `lr`, or with LoRA at its rule (`policy.lora`)."""
    return adapted_optimizer(self.lora, lr, build)

  def reference(self, graphdef, buffers) -> tuple:
    """(graphdef, weights) of the frozen reference (GRPO's KL, DPO's in-step): the starting weights' copy in
    `buffers["ref"]`, or with LoRA the base through the adapter-free graph (the same arrays as the policy's base,
    the adapters off)."""
    if self.lora is None:
      return graphdef, buffers["ref"]
    if self._plain is None:
      from jaxpod.models.llama.lora import base_graphdef
      self._plain = base_graphdef(self.llama)
    return self._plain, buffers

  def _model(self, seed: int):
    """A random model (traced: inside the state's jitted init, or under eval_shape), adapters attached."""
    from flax import nnx
    from jaxpod.models.llama import Llama, lora
    model = Llama(self.llama, rngs=nnx.Rngs(params=seed))
    return model if self.lora is None else lora.attach(model, self.lora.adapters(), seed, traced=True)

  def _split(self, model):
    """(graphdef, params, buffers): every weight trained and `_buffers(params)`, or with LoRA the adapters and the
    base (the only weight copy: a reference runs it with the adapters off, `lora.base_graphdef`)."""
    from flax import nnx
    if self.lora is not None:
      return nnx.split(model, nnx.LoRAParam, ...)
    graphdef, params = nnx.split(model)
    return graphdef, params, self._buffers(params)

  def weights(self, params, buffers):
    """The whole model's state from the train state's halves (with LoRA: base + adapters)."""
    from flax import nnx
    return params if self.lora is None else nnx.merge_state(buffers, params)

  def abstract_model(self, seed: int):
    from flax import nnx
    return self._split(nnx.eval_shape(lambda: self._model(seed)))

  def init_model(self, seed: int):
    """Random weights (traced in the state's jitted init), with their buffers."""
    return self._split(self._model(seed))[1:]

  def load_params(self, url: str, mesh):
    """(graphdef, params) of the HF checkpoint at `url`, placed on `mesh` (read as this task's architecture)."""
    from flax import nnx
    from jaxpod.models.llama import hf_io
    return nnx.split(hf_io.load(url, mesh, cfg=self.llama))

  def _loaded(self, model, mesh):
    """The starting checkpoint's model as the task trains it: `adapter`'s adapters or fresh ones attached."""
    from jaxpod.models.llama import lora, peft_io
    if self.adapter:
      peft_io.load_adapter(model, self.adapter, mesh=mesh)
    elif self.lora is not None:
      lora.attach(model, self.lora.adapters(), self.cfg.trainer.seed, mesh=mesh)
    return model

  def _place(self, params, buffers, shardings):
    """(params, buffers) placed like the trainer's state; the buffers are `_buffers` of the placed params, or with
    LoRA the base placed like the state's buffers."""
    import jax
    params = jax.device_put(params, shardings.params)
    if self.lora is not None:
      return params, jax.device_put(buffers, shardings.buffers)
    return params, self._buffers(params)

  def initial_params(self, mesh, shardings):
    """The starting checkpoint's weights placed like the trainer's params, with their buffers; None: random init."""
    if not self.start_url:
      return None
    from flax import nnx
    graphdef, params = self.load_params(self.start_url, mesh)
    _, params, buffers = self._split(self._loaded(nnx.merge(graphdef, params), mesh))
    return self._place(params, buffers, shardings)

  def init_carry(self, global_batch: int):
    return ()

  def export_hooks(self, graphdef, url: str | None, adapter_url: str | None = None) -> list:
    """The final step's exports: the policy as a HF checkpoint at `url` ([] without a url); with LoRA, the
    merged policy there and always the adapters as PEFT's files (`adapter_url`, None: `<run>/adapter`)."""
    if self.lora is not None:
      return [AdapterExportHook(graphdef, self.weights, self.start_url or "", adapter_url, url)]
    return [HFExportHook(graphdef, url)] if url else []
