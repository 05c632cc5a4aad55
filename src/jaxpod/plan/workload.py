"""What a plan assumes the run does: workload kind, optimizer, EMA, reference, mesh, batch, KV engines, publish."""
from __future__ import annotations

import dataclasses

from jaxpod.runtime.mesh import MeshConfig

KINDS = ("train", "preference", "rl")
OPTIMIZERS = {"adam": 2, "adamw": 2, "adamatan2": 2, "momentum": 1, "sgd": 0}  # state copies of the params


@dataclasses.dataclass(frozen=True)
class Workload:
  """The run a plan sizes (defaults: jaxpod's own, e.g. the mesh fills data over every device)."""

  kind: str = "train"  # train | preference | rl
  optimizer: str = "adamw"  # adam | adamw | adamatan2 (mu + nu) | momentum (one copy) | sgd (none)
  ema: float | None = None  # EMA decay (0: no EMA copy); None: the workload's default (train 0.99, rl 0)
  reference: bool = False  # a frozen reference copy in the state (DPO/IPO reference: in_step; RL grpo.beta > 0)
  mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)  # data / fsdp / model sizes (-1: fill)
  batch: int = 64  # global rows per optimizer step
  seq_len: int = 2048  # tokens per row
  kv_rows: int = 0  # decode rows of each engine's KV cache (0: rl uses batch, others have no engine)
  kv_len: int = 0  # tokens per KV row, prompt + new (0: seq_len)
  kv_engines: int = 1  # engines alive at once next to the train state (rl: rollout + eval = 2)
  colocated: bool = True  # rl: the engines share the trainer's devices (False: they live on other hosts)
  publish: bool | None = None  # publish weights every step to rollout workers (None: on for rl when not colocated)
  export: bool = True  # write a HF checkpoint at the end (RL's hf/, preference, benches)
  keep_last: int = 2  # checkpoints kept in the bucket
  memory_fraction: float = 0.9  # share of HBM and host RAM a plan lets the run use

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ValueError(f"kind={self.kind!r}: use one of {', '.join(KINDS)}")
    if self.optimizer not in OPTIMIZERS:
      raise ValueError(f"optimizer={self.optimizer!r}: use one of {', '.join(OPTIMIZERS)}")
    if self.ema is not None and not 0.0 <= self.ema < 1.0:
      raise ValueError(f"ema={self.ema}: expected a decay in [0, 1) (0: no EMA copy)")
    for name in ("batch", "seq_len", "kv_engines", "keep_last"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name}={getattr(self, name)}: expected >= 1")
    for name in ("kv_rows", "kv_len"):
      if getattr(self, name) < 0:
        raise ValueError(f"{name}={getattr(self, name)}: expected >= 0 (0: the default)")
    if not 0.0 < self.memory_fraction <= 1.0:
      raise ValueError(f"memory_fraction={self.memory_fraction}: expected a share in (0, 1]")

  @property
  def ema_decay(self) -> float:
    """The EMA decay in effect (train and preference: TrainerConfig's 0.99; rl: 0)."""
    if self.ema is not None:
      return self.ema
    return 0.0 if self.kind == "rl" else 0.99

  @property
  def publishes(self) -> bool:
    return self.publish if self.publish is not None else (self.kind == "rl" and not self.colocated)

  @property
  def engine_rows(self) -> int:
    """KV rows per engine on the trainer's devices (0: no engine there)."""
    if self.kind == "rl" and not self.colocated:
      return 0
    return self.kv_rows or (self.batch if self.kind == "rl" else 0)

  @property
  def engine_len(self) -> int:
    return self.kv_len or self.seq_len
