"""`jaxpod bench trm-parity`: the reference side trains on given batches; spreads and the plot."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from jaxpod.bench.trm import parity as trm_parity
from jaxpod.models.trm import TRMConfig


def _batches(cfg: TRMConfig, rng, n: int, b: int) -> dict:
  labels = rng.integers(2, cfg.vocab_size, (n, b, cfg.seq_len)).astype(np.int32)
  inputs = np.where(rng.random(labels.shape) < 0.5, 1, labels).astype(np.int32)
  return {"inputs": inputs, "labels": labels, "puzzle_identifiers": np.zeros((n, b), np.int32)}


def test_reference_trains_on_the_given_batches_and_reports_each_evaluation(trm_reference):
  """The default recipe's shape (mlp_t, puzzle embedding, softmax loss, fp32) runs in the reference as
  the bench drives it: one curve point per eval step, accuracies in [0, 1], EMA weights restored after."""
  from jaxpod.bench.trm.reference import train_curve
  cfg = dataclasses.replace(TRMConfig.tiny(), seq_len=16, vocab_size=6, mlp_t=True, pos_encodings="none",
                            halt_max_steps=2, loss_type="softmax_cross_entropy")
  rng = np.random.default_rng(0)
  train, evals = _batches(cfg, rng, 3, 4), _batches(cfg, rng, 1, 6)
  data = {**{f"train_{k}": v for k, v in train.items()}, **{f"eval_{k}": v for k, v in evals.items()}}
  spec = {"model_config": cfg.to_reference(4), "loss_type": cfg.loss_type, "seed": 0, "steps": 3, "eval_every": 2,
          "ema": 0.9, "optim": {"lr": 1e-3, "beta1": 0.9, "beta2": 0.95, "weight_decay": 0.1, "puzzle_emb_lr": 1e-2,
                                "puzzle_emb_weight_decay": 0.1, "warmup_steps": 2}}
  curve = train_curve(str(trm_reference), spec, data)
  assert [p["step"] for p in curve] == [2, 3]
  assert all(0.0 <= p["exact_accuracy"] <= 1.0 for p in curve)


def test_spread_is_median_and_range_over_seeds_per_step(tmp_path):
  curves = [[{"step": 100, "exact_accuracy": a}, {"step": 200, "exact_accuracy": b}]
            for a, b in ((0.1, 0.9), (0.3, 1.0), (0.2, 0.95))]
  spread = trm_parity._spread(curves)
  assert spread[100] == pytest.approx({"median": 0.2, "min": 0.1, "max": 0.3, "n": 3})
  assert spread[200] == pytest.approx({"median": 0.95, "min": 0.9, "max": 1.0, "n": 3})
  results = {"seeds": [0, 1, 2], "jaxpod": {"spread": spread}, "reference": {"spread": trm_parity._spread(curves[:2])}}
  path = trm_parity.plot(results, str(tmp_path / "p.png"))
  assert open(path, "rb").read(4) == b"\x89PNG"
