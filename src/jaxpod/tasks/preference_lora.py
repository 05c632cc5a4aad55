"""LoRA for the preference task (`--task.lora.rank 8`): adapters trained, the base frozen and held once, and DPO's
and IPO's reference the same base with the adapters off.

    check(pc)                 # before JAX: task.adapter against task.hf, settings LoRA cannot serve
    lora = section(pc)        # the LoRA the run trains (PreferenceTask.lora): task.lora or task.adapter's
    graphdef, params = start_weights(task, mesh)   # the starting policy, task.adapter merged in (precomputed's)

- State: `params` are the adapters (`nnx.LoRAParam`: the only gradients, Adam mu/nu and EMA), `buffers` the
  frozen base, sharded by its own logical axes. No reference copy: the reference forward merges the SAME base
  arrays into the plain model's graphdef (`LlamaTask.reference`), so it runs the model with its adapters off.
  SimPO needs no reference at all.
- Learning rate: LoRA's one rule (`jaxpod.policy.lora`): the AdamW peak is `task.optim.lr * task.lora.lr_scale`,
  and B's is that times `task.lora.b_lr_ratio` (LoRA+, Hayou et al. 2024: B learns faster than A), so one flag
  switches it on. By default (0) both come by loss (LR_SCALE, B_LR_RATIO, measured: docs/lora.md). SimPO's 2.5
  and 2 are "LoRA Without Regret"'s alpha 32 at 2.5x kept at the shared alpha 16: with Adam and B starting at 0,
  doubling alpha is doubling B's lr (up to Adam's eps and the global-norm clip). At 10x (that paper's ~10x full
  fine-tuning) held-out accuracy peaked and fell. DPO's 3.25 and 3 come from a search on the hardest seed: only
  3.25-3.5 at 3 cleared the bar on every seed, their neighbours did not (DPO's held-out accuracy swings late in a
  LoRA run).
- `task.adapter` (a PEFT folder, with `task.hf` its base) starts the adapters from saved ones. Its
  reference must then be the starting policy (base + that adapter), which adapters-off cannot give: DPO/IPO
  need `task.reference=precomputed`, which runs the merged start once before training.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

from jaxpod.policy.lora import LoraSection, from_adapter
from jaxpod.policy.spec import start_config

LR_SCALE = {"simpo": 2.5, "dpo": 3.25, "ipo": 3.25}  # LoRA lr / full fine-tuning lr by loss (task.lora.lr_scale 0)
B_LR_RATIO = {"simpo": 2.0, "dpo": 3.0, "ipo": 3.0}  # LoRA B's lr / A's lr by loss (task.lora.b_lr_ratio 0)


@dataclasses.dataclass(frozen=True)
class PreferenceLora(LoraSection):
  """LoRA for preference training: the adapters, and their learning rate by loss unless given."""

  unset: ClassVar[str] = f"by loss: {LR_SCALE} and {B_LR_RATIO}"
  lr_scale: float = 0.0  # the adapters train at task.optim.lr x this; 0: by loss (SimPO 2.5, DPO/IPO 3.25)
  b_lr_ratio: float = 0.0  # LoRA+: B's lr / A's lr; 0: by loss (SimPO 2, DPO/IPO 3)


def section(pc) -> PreferenceLora | None:
  """The LoRA a PreferenceConfig trains (None: every weight): task.lora, or task.adapter's files at task.lora's
  rates, a rate left at 0 taken by loss. No JAX; a one-line error naming the field."""
  llama = start_config(pc.hf, pc.model, "task.hf") if pc.adapter and pc.hf else pc.model
  lora = from_adapter(pc.lora, pc.adapter, llama, base=pc.hf, where="task", section=PreferenceLora)
  if lora is None:
    return None
  kind = pc.loss.kind
  return dataclasses.replace(lora, lr_scale=lora.lr_scale or LR_SCALE[kind],
                             b_lr_ratio=lora.b_lr_ratio or B_LR_RATIO[kind])


def check(pc) -> None:
  """Validate a PreferenceConfig's LoRA settings (no JAX): one line naming the field and the fix."""
  if section(pc) is None:
    return
  if pc.data.path is not None and not pc.hf:
    raise ValueError("task.lora with task.data.path needs task.hf: LoRA adapts a trained base, and a random base "
                     "stays frozen; give the checkpoint with task.hf or drop task.lora")
  if pc.data.path is None and pc.sort.warmup_steps < 1:
    raise ValueError("task.lora with task.sort.warmup_steps=0 would adapt a random frozen base; keep "
                     "task.sort.warmup_steps >= 1 (the built-in default's base) or drop task.lora")
  if pc.adapter and pc.loss.needs_reference and pc.reference == "in_step":
    raise ValueError(f"task.adapter with task.loss.kind={pc.loss.kind} and task.reference=in_step: the "
                     "reference would be the base without the adapter, not the starting policy; use "
                     "task.reference=precomputed (base + adapter, once) or merge the adapter into task.hf")


def start_weights(task, mesh):
  """(graphdef, params) of a PreferenceTask's starting policy (task.adapter's adapter merged in): what the precomputed
  reference runs once."""
  from flax import nnx
  graphdef, params = task.load_params(task.start_url, mesh)
  if not task.adapter:
    return graphdef, params
  from jaxpod.models.llama import lora, peft_io
  model = peft_io.load_adapter(nnx.merge(graphdef, params), task.adapter, mesh=mesh)
  return nnx.split(lora.merged(model))
