"""TRM configuration: one frozen dataclass for the network + ACT loop, one for its optimizers.

Field names are snake_case; `TRMConfig.from_reference` accepts the reference PyTorch
`model_config` dict (`H_cycles`, `forward_dtype`, ...) so golden configs load unchanged.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

_POS_ENCODINGS = ("rope", "learned", "none")
_DTYPES = ("float32", "bfloat16")
_LOSS_TYPES = ("stablemax_cross_entropy", "softmax_cross_entropy")


def _find_multiple(a: int, b: int) -> int:
  return -(a // -b) * b


def swiglu_width(dim: int, expansion: float) -> int:
  """The reference SwiGLU inner width: round(expansion * dim * 2/3) rounded up to a multiple of 256."""
  return _find_multiple(round(expansion * dim * 2 / 3), 256)


@dataclasses.dataclass(frozen=True)
class TRMConfig:
  """Tiny Recursive Model: network shape, recursion depth, halting and loss."""

  seq_len: int = 81  # tokens per example (9x9 sudoku)
  vocab_size: int = 11  # 0 pad, 1 blank, 2..10 digits
  num_puzzle_identifiers: int = 1  # rows of the puzzle-embedding table
  puzzle_emb_ndim: int = 512  # width of one puzzle embedding (0 disables it)
  puzzle_emb_len: int = 16  # prefix positions holding the puzzle embedding (0: ceil(ndim / hidden))
  hidden_size: int = 512  # channel width
  expansion: float = 4.0  # SwiGLU expansion before the 2/3 and multiple-of-256 rounding
  num_heads: int = 8  # attention heads (unused with mlp_t)
  l_layers: int = 2  # blocks in the one shared network
  h_cycles: int = 3  # z_H updates per ACT step (all but the last without gradient)
  l_cycles: int = 6  # z_L updates per z_H update
  pos_encodings: str = "none"  # "rope", "learned" or "none"
  mlp_t: bool = True  # token mixing by an MLP across positions instead of attention
  rope_theta: float = 10000.0  # RoPE base
  rms_norm_eps: float = 1e-5  # epsilon of the scale-free RMSNorm
  halt_max_steps: int = 16  # ACT steps before a row is forced to halt
  halt_exploration_prob: float = 0.1  # train: chance a row draws a minimum step count in [2, max]
  no_act_continue: bool = True  # halt on q_halt > 0 alone (the only mode implemented)
  compute_dtype: str = "float32"  # activations/matmuls: "float32" or "bfloat16" (params stay fp32)
  loss_type: str = "stablemax_cross_entropy"  # or "softmax_cross_entropy"

  def __post_init__(self):
    for name in ("seq_len", "vocab_size", "num_puzzle_identifiers", "hidden_size", "num_heads", "l_layers",
                 "h_cycles", "l_cycles", "halt_max_steps"):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f"TRMConfig.{name}={value!r}: expected a positive integer")
    for name in ("puzzle_emb_ndim", "puzzle_emb_len"):
      if getattr(self, name) < 0:
        raise ValueError(f"TRMConfig.{name}={getattr(self, name)}: expected >= 0")
    if self.pos_encodings not in _POS_ENCODINGS:
      raise ValueError(f"TRMConfig.pos_encodings={self.pos_encodings!r}: expected one of {_POS_ENCODINGS}")
    if self.compute_dtype not in _DTYPES:
      raise ValueError(f"TRMConfig.compute_dtype={self.compute_dtype!r}: expected one of {_DTYPES}")
    if self.loss_type not in _LOSS_TYPES:
      raise ValueError(f"TRMConfig.loss_type={self.loss_type!r}: expected one of {_LOSS_TYPES}")
    if not 0.0 <= self.halt_exploration_prob <= 1.0:
      raise ValueError(f"TRMConfig.halt_exploration_prob={self.halt_exploration_prob}: expected a probability")
    if not self.no_act_continue:
      raise ValueError("TRMConfig.no_act_continue=False (the Q-continue target) is not implemented; "
                       "set no_act_continue=True as the paper's runs do")
    if not self.mlp_t and self.hidden_size % self.num_heads:
      raise ValueError(f"TRMConfig.hidden_size={self.hidden_size} is not divisible by num_heads={self.num_heads}; "
                       "pick num_heads dividing hidden_size")
    if self.pos_encodings == "rope" and not self.mlp_t and (self.hidden_size // self.num_heads) % 2:
      raise ValueError(f"TRMConfig: RoPE needs an even head_dim, got {self.hidden_size // self.num_heads}")
    if self.puzzle_emb_ndim == 0 and self.puzzle_emb_len:
      raise ValueError(f"TRMConfig.puzzle_emb_len={self.puzzle_emb_len} reserves prefix positions but puzzle_emb_ndim=0 "
                       "fills none (the reference would mis-slice the logits); set puzzle_emb_len=0")
    if self.puzzle_emb_ndim > self.prefix_len * self.hidden_size:
      raise ValueError(f"TRMConfig.puzzle_emb_ndim={self.puzzle_emb_ndim} does not fit in puzzle_emb_len="
                       f"{self.puzzle_emb_len} positions of hidden_size={self.hidden_size}; raise puzzle_emb_len")

  @property
  def prefix_len(self) -> int:
    """Prefix positions reserved for the puzzle embedding (the reference's resolved puzzle_emb_len)."""
    if self.puzzle_emb_len:
      return self.puzzle_emb_len
    return -(self.puzzle_emb_ndim // -self.hidden_size)

  @property
  def total_seq_len(self) -> int:
    return self.seq_len + self.prefix_len

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def embed_scale(self) -> float:
    return math.sqrt(self.hidden_size)

  @classmethod
  def from_reference(cls, model_config: Mapping[str, Any], **overrides) -> "TRMConfig":
    """Build from the reference PyTorch `model_config` dict (unknown keys such as batch_size are ignored)."""
    rename = {"H_cycles": "h_cycles", "L_cycles": "l_cycles", "L_layers": "l_layers", "no_ACT_continue": "no_act_continue",
              "forward_dtype": "compute_dtype"}
    fields = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in model_config.items():
      name = rename.get(key, key)
      if name in fields:
        kwargs[name] = value
    kwargs.update(overrides)
    return cls(**kwargs)

  def to_reference(self, batch_size: int) -> dict:
    """The reference PyTorch `model_config` dict for this config (inverse of `from_reference`)."""
    return dict(batch_size=batch_size, seq_len=self.seq_len, puzzle_emb_ndim=self.puzzle_emb_ndim,
                num_puzzle_identifiers=self.num_puzzle_identifiers, vocab_size=self.vocab_size,
                H_cycles=self.h_cycles, L_cycles=self.l_cycles, H_layers=0, L_layers=self.l_layers,
                hidden_size=self.hidden_size, expansion=self.expansion, num_heads=self.num_heads,
                pos_encodings=self.pos_encodings, rms_norm_eps=self.rms_norm_eps, rope_theta=self.rope_theta,
                halt_max_steps=self.halt_max_steps, halt_exploration_prob=self.halt_exploration_prob,
                forward_dtype=self.compute_dtype, mlp_t=self.mlp_t, puzzle_emb_len=self.puzzle_emb_len,
                no_ACT_continue=self.no_act_continue)

  # Presets (variants by dataclasses.replace).
  @classmethod
  def sudoku_mlp(cls) -> "TRMConfig":
    """The paper's best Sudoku-Extreme model: mlp_t, no position encoding (5,028,866 parameters)."""
    return cls(mlp_t=True, pos_encodings="none", compute_dtype="bfloat16")

  @classmethod
  def sudoku_att(cls) -> "TRMConfig":
    """The paper's attention variant with RoPE (6,828,034 parameters)."""
    return cls(mlp_t=False, pos_encodings="rope", compute_dtype="bfloat16")

  @classmethod
  def tiny(cls) -> "TRMConfig":
    """A small attention model that trains on a 2-core CPU."""
    return cls(hidden_size=64, num_heads=4, puzzle_emb_ndim=64, puzzle_emb_len=1, h_cycles=2, l_cycles=2,
               mlp_t=False, pos_encodings="rope", halt_max_steps=4)


@dataclasses.dataclass(frozen=True)
class TRMOptimConfig:
  """AdamATan2 for the network, SignSGD for the puzzle-embedding table, one warmup(-cosine) schedule."""

  lr: float = 1e-4  # AdamATan2 base learning rate
  beta1: float = 0.9  # AdamATan2 first-moment decay
  beta2: float = 0.95  # AdamATan2 second-moment decay
  weight_decay: float = 1.0  # decoupled, applied as p *= 1 - lr * wd
  puzzle_emb_lr: float = 1e-4  # SignSGD base learning rate of the puzzle-embedding table
  puzzle_emb_weight_decay: float = 1.0  # SignSGD decoupled weight decay (rows used in the step only)
  warmup_steps: int = 2000  # linear warmup from 0
  total_steps: int = 0  # cosine horizon; only used when lr_min_ratio < 1
  lr_min_ratio: float = 1.0  # 1.0 = constant after warmup (the Sudoku runs)

  def __post_init__(self):
    for name in ("lr", "puzzle_emb_lr", "weight_decay", "puzzle_emb_weight_decay"):
      if getattr(self, name) < 0:
        raise ValueError(f"TRMOptimConfig.{name}={getattr(self, name)}: expected >= 0")
    for name in ("beta1", "beta2"):
      if not 0.0 <= getattr(self, name) < 1.0:
        raise ValueError(f"TRMOptimConfig.{name}={getattr(self, name)}: expected a value in [0, 1)")
    if self.warmup_steps < 0:
      raise ValueError(f"TRMOptimConfig.warmup_steps={self.warmup_steps}: expected >= 0")
    if not 0.0 <= self.lr_min_ratio <= 1.0:
      raise ValueError(f"TRMOptimConfig.lr_min_ratio={self.lr_min_ratio}: expected a value in [0, 1]")
    if self.lr_min_ratio < 1.0 and self.total_steps <= self.warmup_steps:
      raise ValueError(f"TRMOptimConfig.total_steps={self.total_steps} must exceed warmup_steps="
                       f"{self.warmup_steps} when lr_min_ratio < 1 (cosine decay needs a horizon)")


def load_configs(path: str) -> tuple[TRMConfig, TRMOptimConfig, dict]:
  """Read a TRM YAML file: `model:` -> TRMConfig, `optim:` -> TRMOptimConfig, anything else returned as-is."""
  import fsspec
  import yaml
  with fsspec.open(path, "r") as f:
    raw = yaml.safe_load(f) or {}
  model = dict(raw.pop("model", {}) or {})
  optim = dict(raw.pop("optim", {}) or {})
  for section, cls, values in (("model", TRMConfig, model), ("optim", TRMOptimConfig, optim)):
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
      raise ValueError(f"{path}: unknown keys {unknown} in `{section}:`; valid keys are {sorted(known)}")
  return TRMConfig(**model), TRMOptimConfig(**optim), raw
