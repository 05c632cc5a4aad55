"""LoRA for the preference task (`--task.lora.rank 8`): adapters trained, the base frozen and held once, and DPO's
and IPO's reference the same base with the adapters off.

    check(pc)                               # before JAX: adapter_from against task.hf, settings LoRA cannot serve
    class PreferenceTask(LoraParts, LlamaTask): ...   # the trainer state's halves: params = adapters, buffers = base

- State: `params` are the adapters (`nnx.LoRAParam`: the only gradients, Adam mu/nu and EMA), `buffers` the
  frozen base, sharded by its own logical axes. No reference copy: the reference forward merges the SAME base
  arrays into the plain model's graphdef (`lora.base_graphdef`), so it runs the model with its adapters off.
  SimPO needs no reference at all.
- Learning rate: with LoRA the AdamW peak is `task.optim.lr * task.lora_lr_scale`, and B's is that times
  `task.lora_b_lr_ratio` (LoRA+, Hayou et al. 2024: B learns faster than A), so one flag switches it on. By
  default (0) both come by loss (LR_SCALE, B_LR_RATIO, measured: docs/lora.md). SimPO's 2.5 and 2 are "LoRA
  Without Regret"'s alpha 32 at 2.5x kept at the shared alpha 16: with Adam and B starting at 0, doubling alpha
  is doubling B's lr (up to Adam's eps and the global-norm clip). At 10x (that paper's ~10x full fine-tuning)
  held-out accuracy peaked and fell. DPO's 3.25 and 3 come from a search on the hardest seed: only 3.25-3.5 at 3
  cleared the bar on every seed, their neighbours did not (DPO's held-out accuracy swings late in a LoRA run).
- `task.adapter_from` (a PEFT folder, with `task.hf` its base) starts the adapters from saved ones. Its
  reference must then be the starting policy (base + that adapter), which adapters-off cannot give: DPO/IPO
  need `task.reference=precomputed`, which runs the merged start once before training.
"""
from __future__ import annotations

from jaxpod.runtime import storage

LR_SCALE = {"simpo": 2.5, "dpo": 3.25, "ipo": 3.25}  # LoRA lr / full fine-tuning lr by loss (task.lora_lr_scale 0)
B_LR_RATIO = {"simpo": 2.0, "dpo": 3.0, "ipo": 3.0}  # LoRA B's lr / A's lr by loss (task.lora_b_lr_ratio 0)


def check(pc) -> None:
  """Validate a PreferenceConfig's LoRA settings (no JAX): one line naming the field and the fix; sets `pc.lora`
  from `pc.adapter_from`'s files."""
  if pc.lora_b_lr_ratio < 0:
    raise ValueError(f"task.lora_b_lr_ratio={pc.lora_b_lr_ratio}: expected > 0 (B's lr / A's lr), or 0 for the "
                     f"default by loss {B_LR_RATIO}")
  if pc.lora_lr_scale < 0:
    raise ValueError(f"task.lora_lr_scale={pc.lora_lr_scale}: expected > 0 (LoRA's lr = task.optim.lr x this), "
                     f"or 0 for the default by loss {LR_SCALE}")
  if pc.adapter_from:
    _adapter_lora(pc)
  if pc.lora is None:
    return
  if pc.data.path is not None and not pc.hf:
    raise ValueError("task.lora with task.data.path needs task.hf: LoRA adapts a trained base, and a random base "
                     "stays frozen; give the checkpoint with task.hf or drop task.lora")
  if pc.data.path is None and pc.sort.warmup_steps < 1:
    raise ValueError("task.lora with task.sort.warmup_steps=0 would adapt a random frozen base; keep "
                     "task.sort.warmup_steps >= 1 (the built-in default's base) or drop task.lora")
  if pc.adapter_from and pc.loss.needs_reference and pc.reference == "in_step":
    raise ValueError(f"task.adapter_from with task.loss.kind={pc.loss.kind} and task.reference=in_step: the "
                     "reference would be the base without the adapter, not the starting policy; use "
                     "task.reference=precomputed (base + adapter, once) or merge the adapter into task.hf")


def _adapter_lora(pc) -> None:
  """task.lora from adapter_from's files, after checking their names and shapes against task.hf's config.json."""
  from jaxpod.models.llama import peft_io
  from jaxpod.models.llama.config import LlamaConfig
  if not pc.hf:
    raise ValueError(f"task.adapter_from={pc.adapter_from} needs task.hf: the base checkpoint it was trained on")
  url = storage.join(pc.hf, "config.json")
  if not storage.exists(url):
    raise FileNotFoundError(f"task.hf={pc.hf}: no config.json there; point it at a HF checkpoint")
  lcfg = peft_io.check_adapter(pc.adapter_from, LlamaConfig.from_json_file(url))
  if pc.lora is not None and pc.lora != lcfg:
    raise ValueError(f"task.lora={pc.lora} differs from task.adapter_from's adapter_config.json ({lcfg}); "
                     "drop task.lora (the adapter's files set it)")
  object.__setattr__(pc, "lora", lcfg)


class LoraParts:
  """What LoRA changes in the preference task beyond `LlamaTask`'s adapter hooks: DPO's reference, the starting
  weights precomputed runs, the learning rate. Needs `self.pc` (the task config)."""

  def reference_model(self, graphdef, params, buffers):
    """(graphdef, state) of DPO's in-step reference: the frozen copy, or with LoRA the base with adapters off."""
    if self.pc.lora is None:
      return graphdef, buffers["ref"]
    from jaxpod.models.llama import lora
    return lora.base_graphdef(self.llama), buffers

  def start_weights(self, mesh):
    """(graphdef, params) of the starting policy (task.adapter_from's adapter merged in): what precomputed runs."""
    from flax import nnx
    graphdef, params = self.load_params(self.start_url, mesh)
    if not self.pc.adapter_from:
      return graphdef, params
    from jaxpod.models.llama import lora, peft_io
    model = peft_io.load_adapter(nnx.merge(graphdef, params), self.pc.adapter_from, mesh=mesh)
    return nnx.split(lora.merged(model))

  def optim(self):
    """task.optim, with LoRA at lr x task.lora_lr_scale (0: LR_SCALE of the loss)."""
    import dataclasses
    o, pc = self.pc.optim, self.pc
    return o if pc.lora is None else dataclasses.replace(o, lr=o.lr * (pc.lora_lr_scale or LR_SCALE[pc.loss.kind]))

  def optimizer(self):
    """(optax transformation, lr schedule) of `optim()`; with LoRA, B's updates x task.lora_b_lr_ratio (LoRA+)."""
    from jaxpod.models.llama.lora import scale_b
    tx, sched = self.optim().build(self.cfg.trainer.steps)
    if not self.pc.lora:
      return tx, sched
    return scale_b(tx, self.pc.lora_b_lr_ratio or B_LR_RATIO[self.pc.loss.kind]), sched
