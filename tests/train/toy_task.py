"""A third task in one module: linear regression on integer features, for the one trainer.

What adding a task takes: this module (its config, registered by the one line marked below,
and the `jaxpod.train.task.Task` its `build` returns); no file of jaxpod changes. Inside the
package it would be `src/jaxpod/tasks/<name>.py`, found by the registry without an import.

    y = x @ W_TRUE, x in {-2..2}^4 (batches cross `global_batch` as int32), model y^ = x @ w, MSE loss.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from jaxpod.train.config import DataConfig, TaskConfig, TrainConfig

W_TRUE = np.array([1.0, -2.0, 0.5, 3.0], np.float32)


@dataclasses.dataclass(frozen=True)
class ToyData(DataConfig):
  """Random integer features; the global batch of step k is drawn from (seed, k) alone."""

  global_batch_size: int = 16  # rows per training step over all hosts
  eval_batch_size: int = 64  # held-out rows, evaluated in one batch
  end_after: int = 0  # batches the iterator yields before it raises EndOfData (0: endless)


@TaskConfig.register_subclass("toy_linear")  # the registry line
@dataclasses.dataclass(frozen=True)
class ToyLinearConfig(TaskConfig):
  """Linear regression: `task: {type: toy_linear, lr: 0.05}`."""

  data: ToyData = dataclasses.field(default_factory=ToyData)
  lr: float = 0.05  # SGD learning rate

  prefix = "toy"

  def build(self, cfg: TrainConfig) -> "ToyTask":
    return ToyTask(cfg)


def _rows(seed: int, stream: int, n: int) -> dict:
  rng = np.random.default_rng([seed, stream])
  x = rng.integers(-2, 3, size=(n, len(W_TRUE)))
  return {"x": x, "y": (x @ W_TRUE * 2).astype(np.int64)}  # y scaled by 2 stays an integer (0.5 weight)


class _Iter:
  """This host's rows of each global batch; its state is the step (what the checkpoint stores)."""

  def __init__(self, data: ToyData, host: int, hosts: int):
    self.data, self.per, self.host, self.step = data, data.global_batch_size // hosts, host, 0

  def __next__(self) -> dict:
    if self.data.end_after and self.step >= self.data.end_after:
      from jaxpod.train.task import EndOfData
      raise EndOfData(f"toy: the {self.data.end_after} batches of task.data.end_after are trained")
    rows = _rows(self.data.seed, 1 + self.step, self.data.global_batch_size)
    self.step += 1
    return {k: v[self.host * self.per:(self.host + 1) * self.per] for k, v in rows.items()}

  def get_state(self) -> dict:
    return {"step": self.step}

  def set_state(self, state: dict) -> None:
    self.step = int(state["step"])


class ToyTask:
  """The `Task` protocol for linear regression (see jaxpod.train.task)."""

  name = ToyLinearConfig.prefix
  headline = "mse"
  batch_ndims = {"x": 2, "y": 1}

  def __init__(self, cfg: TrainConfig):
    self.cfg, self.task = cfg, cfg.task

  def prepare(self) -> int:
    return len(W_TRUE)

  def setup(self, prepared: int, host_index: int, host_count: int) -> None:
    self.features, self.host, self.hosts = prepared, host_index, host_count

  def _model(self, seed: int):
    import jax.numpy as jnp
    from flax import nnx

    class Linear(nnx.Module):
      def __init__(self, n: int):
        self.w = nnx.Param(jnp.zeros((n,), jnp.float32))

    return Linear(self.features)

  def abstract_model(self, seed: int):
    from flax import nnx
    graphdef, params = nnx.split(nnx.eval_shape(lambda: self._model(seed)))
    return graphdef, params, {}

  def init_model(self, seed: int):
    from flax import nnx
    return nnx.split(self._model(seed))[1], {}

  def init_carry(self, global_batch: int):
    return ()

  def optimizer(self):
    import optax
    return optax.sgd(self.task.lr), None

  def loss_fn(self, graphdef):
    import jax.numpy as jnp
    from flax import nnx

    def loss(params, buffers, batch, rng, carry):
      w = nnx.merge(graphdef, params).w[...]
      err = batch["x"].astype(jnp.float32) @ w - batch["y"].astype(jnp.float32) / 2
      return jnp.mean(err ** 2), (carry, {"sq_sum": jnp.sum(err ** 2)})

    return loss

  def normalize(self, raw: dict, global_batch: int) -> dict:
    return {"loss": raw["sq_sum"] / global_batch, "grad_norm": raw["grad_norm"]}

  def train_iter(self):
    return _Iter(self.task.data, self.host, self.hosts)

  def evaluator(self, graphdef, mesh, ema_sh, buffer_sh, batch_sh):
    import jax
    from flax import nnx
    rows = _rows(self.task.data.seed, 0, self.task.data.eval_batch_size)  # stream 0: never a training batch

    def evaluate(params, buffers) -> dict:
      w = np.asarray(jax.device_get(nnx.merge(graphdef, params).w[...]))
      err = rows["x"] @ w - rows["y"] / 2
      return {"mse": float(np.mean(err ** 2)), "count": len(err)}

    return evaluate

  def hooks(self, graphdef, mesh, tcfg) -> list:
    return []

  def eval_summary(self, ev: dict) -> list[tuple[str, str]]:
    return [("eval mse", f"{ev.get('mse', float('nan')):.4f} on {ev.get('count', 0)} held-out rows")]
