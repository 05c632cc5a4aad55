"""LoRA in a training workload: the adapters' section with its learning-rate rule, one rule for rl, preference and
causal LM, and the section a run trains when it starts from a PEFT adapter.

    lora = LoraSection(rank=8, lr_scale=2.5, b_lr_ratio=2)        # `--task.lora.rank 8` (rl: `--lora.rank 8`)
    tx, sched = adapted_optimizer(lora, lr, lambda peak: adamw(peak))  # adapters at lr x 2.5, B's updates x 2 more
    lora = from_adapter(lora, "gs://b/adapter", llama, base="gs://b/base", where="task", section=LoraSection)

The rule: full fine-tuning trains at the workload's learning rate; LoRA trains the adapters at that rate x
`lr_scale`, and B's updates are scaled by `b_lr_ratio` after the optimizer (LoRA+, Hayou et al. 2024: B learns
faster than A; B starts at 0). Each workload's section subclass sets its measured defaults (docs/lora.md): rl
5 and 1, preference by loss (0: SimPO 2.5 and 2, DPO/IPO 3.25 and 3), causal LM 1 and 1.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, ClassVar

from jaxpod.models.llama.config import LlamaConfig
from jaxpod.models.llama.lora import LoraConfig


@dataclasses.dataclass(frozen=True)
class LoraSection(LoraConfig):
  """LoRA adapters trained on a frozen base (`--task.lora.rank N`), and their learning rate."""

  section: ClassVar[str] = "task.lora"  # where these fields sit on the command line (error messages)
  unset: ClassVar[str] = ""  # what 0 means for lr_scale and b_lr_ratio in this section ("": 0 is refused)

  lr_scale: float = 1.0  # the adapters train at the workload's learning rate x this
  b_lr_ratio: float = 1.0  # LoRA+: B's lr / A's lr (B's updates scaled after the optimizer)

  def __post_init__(self):
    super().__post_init__()
    for name, one in (("lr_scale", "the same lr as full fine-tuning"), ("b_lr_ratio", "B at A's lr")):
      value = getattr(self, name)
      if not (value > 0 or (value == 0 and self.unset)):
        zero = f", or 0 ({self.unset})" if self.unset else ""
        raise ValueError(f"{self.section}.{name}={value} must be > 0 (1: {one}){zero}")

  def adapters(self) -> LoraConfig:
    """The adapters alone (what the model and PEFT's files hold)."""
    return LoraConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(LoraConfig)})


def adapted_optimizer(lora: LoraSection | None, lr: float, build: Callable[[float], tuple]) -> tuple:
  """(optax transformation, lr schedule) of `build(peak lr)`: at `lr` without LoRA; with it at lr x lora.lr_scale,
  every adapter B's updates x lora.b_lr_ratio after it."""
  if lora is None:
    return build(lr)
  from jaxpod.models.llama.lora import scale_b
  tx, sched = build(lr * lora.lr_scale)
  return scale_b(tx, lora.b_lr_ratio), sched


def from_adapter(lora: LoraSection | None, adapter: str, llama: LlamaConfig, *, base: str, where: str,
                 section: type[LoraSection]) -> LoraSection | None:
  """The LoRA section a run trains: `lora` as given, or with `adapter` (a PEFT folder, checked against `llama`, the
  base's architecture) its files' adapters at `lora`'s learning rates (`section`'s defaults without `lora`).
  One-line ValueError without `base` (the checkpoint the adapter was trained on) or when `lora` names other
  adapters. No JAX."""
  if not adapter:
    return lora
  if not base:
    raise ValueError(f"{where}.adapter={adapter} needs {where}.hf: the base checkpoint it was trained on")
  from jaxpod.models.llama import peft_io
  files = peft_io.check_adapter(adapter, llama)
  if lora is not None and lora.adapters() not in (files, LoraConfig()):
    raise ValueError(f"{where}.lora={lora.adapters()} differs from {where}.adapter's adapter_config.json ({files}); "
                     f"drop {where}.lora's rank, alpha, rslora and target_modules (the adapter's files set them)")
  rates = {"lr_scale": lora.lr_scale, "b_lr_ratio": lora.b_lr_ratio} if lora is not None else {}
  return section(**dataclasses.asdict(files), **rates)
