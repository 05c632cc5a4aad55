"""Parameter counts and analytic model FLOPs of a TRM step (matmuls only, 2 FLOPs per multiply-add)."""
from __future__ import annotations

import jax
from flax import nnx

from jaxpod.models.trm.config import TRMConfig, swiglu_width
from jaxpod.models.trm.layers import PuzzleEmbedding


def count_params(model_or_params, include_puzzle_emb: bool = False) -> int:
  """Trainable parameters of a TRM (or its params State); by default without the puzzle table, as the reference."""
  params = model_or_params
  if isinstance(params, nnx.Module):
    params = nnx.state(params, nnx.Param)
  leaves = jax.tree.leaves(params, is_leaf=lambda v: isinstance(v, nnx.Variable))
  return sum(int(v.size) for v in leaves
             if isinstance(v, nnx.Param) and (include_puzzle_emb or not isinstance(v, PuzzleEmbedding)))


def l_level_flops(cfg: TRMConfig) -> int:
  """Forward FLOPs of one call of the shared network, per example."""
  t, d = cfg.total_seq_len, cfg.hidden_size
  per_block = 6 * t * d * swiglu_width(d, cfg.expansion)
  if cfg.mlp_t:
    per_block += 6 * d * t * swiglu_width(t, cfg.expansion)
  else:
    per_block += 8 * t * d * d + 4 * t * t * d
  return cfg.l_layers * per_block


def step_flops(cfg: TRMConfig, batch: int, train: bool = True) -> int:
  """Model FLOPs of one ACT step for `batch` rows; training adds 2x the forward of the gradient cycle."""
  calls = cfg.h_cycles * (cfg.l_cycles + 1)
  heads = 2 * cfg.seq_len * cfg.hidden_size * cfg.vocab_size + 2 * cfg.hidden_size * 2
  forward = calls * l_level_flops(cfg) + heads
  backward = 2 * ((cfg.l_cycles + 1) * l_level_flops(cfg) + heads) if train else 0
  return batch * (forward + backward)
