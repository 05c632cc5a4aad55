"""TRM on Sudoku: evaluation over the full test set with the EMA weights (`trm_sudoku` task).

Each test batch starts from a fresh carry (every row halted, so every row takes its puzzle)
and runs exactly `halt_max_steps` eval-mode ACT steps inside one jitted function; metrics are
those of the final ACT step. Padding rows of the last batch carry no valid label, so the
model's metrics already exclude them (`count` counts real rows only). Evaluation never
touches the training state, its carry or the training data iterator (invariant 6).
"""
from __future__ import annotations

import jax
from jax.sharding import NamedSharding, PartitionSpec

from jaxpod import runtime
from jaxpod.models import trm
from jaxpod.train.step import global_batch, host_metrics

SUMMED = ("count", "exact_accuracy", "accuracy", "q_halt_accuracy", "steps", "lm_loss", "q_halt_loss", "loss")


def eval_batch_fn(graphdef, cfg: trm.TRMConfig):
  """Pure: (params, buffers, batch) -> raw metric sums after the final ACT step."""
  def run(params, buffers, batch):
    carry = trm.init_carry(cfg, batch["inputs"].shape[0])
    carry, _, metrics, _ = trm.eval_step(graphdef, params, buffers, carry, batch, cfg.loss_type)

    def body(_, c):
      carry, _ = c
      carry, _, metrics, _ = trm.eval_step(graphdef, params, buffers, carry, batch, cfg.loss_type)
      return carry, metrics

    _, metrics = jax.lax.fori_loop(1, cfg.halt_max_steps, body, (carry, metrics))
    return metrics

  return run


class Evaluator:
  """Compiles the eval program once; `__call__(params, buffers)` sweeps the whole test set."""

  def __init__(self, graphdef, cfg: trm.TRMConfig, mesh, param_sh, buffer_sh, batch_sh: dict, make_iterator):
    self.mesh, self.batch_sh, self.make_iterator = mesh, batch_sh, make_iterator
    replicated = NamedSharding(mesh, PartitionSpec())
    self._fn = runtime.jit(eval_batch_fn(graphdef, cfg), name="eval_batch",
                           in_shardings=(param_sh, buffer_sh, batch_sh), out_shardings=replicated)

  def __call__(self, params, buffers) -> dict:
    """{exact_accuracy, accuracy, steps, loss, count} over the test set (padding rows excluded)."""
    totals = dict.fromkeys(SUMMED, 0.0)
    pending = []
    for local in self.make_iterator():
      pending.append(self._fn(params, buffers, global_batch(local, self.batch_sh)))
    for metrics in pending:  # dispatch everything first, then read
      for k, v in host_metrics(metrics).items():
        if k in totals:
          totals[k] += v
    count = max(totals["count"], 1)
    return {"exact_accuracy": totals["exact_accuracy"] / count, "accuracy": totals["accuracy"] / count,
            "q_halt_accuracy": totals["q_halt_accuracy"] / count, "steps": totals["steps"] / count,
            "lm_loss": totals["lm_loss"] / count, "count": int(totals["count"])}
