"""`jaxpod plan --compile`: the programs a run executes, compiled for the pod by the TPU compiler (libtpu), here.

    from jaxpod.plan.compile import compile_programs
    results = compile_programs(cfg, PodShape.named("v5p-64"), workload, microbatches=1)
    results[0].total_bytes, results[0].collectives["all-gather"].bytes

No TPU is needed: libtpu compiles ahead of time for a topology named like the pod (`v5p-64` -> `v5p:2x4x4`,
32 chips; `jax.experimental.topologies`). Every input is a `jax.ShapeDtypeStruct` carrying its NamedSharding
on a mesh of the topology's devices (the workload's `MeshConfig`, jaxpod's logical sharding rules): nothing is
allocated. Programs:

  train   the train step of the workload kind with that task's own loss and optimizer (`Task.loss_fn`,
          `Task.optimizer`, `Task.abstract_batch`): train = the causal LM's next-token loss; preference = SimPO,
          or DPO with its in-step reference when `reference`; rl = GRPO, with a reference (beta 0.04) when
          `reference`. The state as `train_state_shardings` places it (EMA at the workload's decay), donated.

The figures per device are the compiler's (`memory_analysis`: arguments, temporaries, outputs, aliased),
total = arguments + temporaries + outputs - aliased; collectives are read from the HLO (`plan.collectives`);
model flops are counted analytically (the compiler's `cost_analysis` counts a loop body once).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import re
import time

from jaxpod.models.llama.config import LlamaConfig
from jaxpod.plan.collectives import Collective, collectives, kernels
from jaxpod.plan.pods import PodShape
from jaxpod.plan.workload import Workload

GIB = 2 ** 30
# HBM per chip as the TPU compiler counts it (its out-of-memory message): GiB
HBM_GIB = {"v4": 32.0, "v5p": 95.74, "v5e": 16.0, "v6e": 31.25}
PEAK_TFLOPS = {"v4": 275.0, "v5p": 459.0, "v5e": 197.0, "v6e": 918.0}  # bf16 per chip
REFERENCE_BETA = 0.04  # GRPO's KL weight when the plan asks for a reference


class CompileError(RuntimeError):
  """A one-line reason `--compile` cannot run (no libtpu, a GPU pod)."""


@dataclasses.dataclass
class Compiled:
  """One program's figures per device, by the TPU compiler."""

  program: str
  arguments_bytes: int = 0
  temp_bytes: int = 0
  output_bytes: int = 0
  alias_bytes: int = 0
  hbm_bytes: int = 0
  compile_s: float = 0.0
  model_flops: float = 0.0  # per device per step, counted analytically
  collectives: dict[str, Collective] = dataclasses.field(default_factory=dict)
  collectives_exact: bool = True
  kernels: dict[str, int] = dataclasses.field(default_factory=dict)  # Mosaic kernels in the HLO by name (splash...)
  error: str = ""  # the compiler's RESOURCE_EXHAUSTED line when it does not fit

  @property
  def total_bytes(self) -> int:
    return self.arguments_bytes + self.temp_bytes + self.output_bytes - self.alias_bytes

  @property
  def fits(self) -> bool:
    return not self.error and self.total_bytes <= self.hbm_bytes

  def to_dict(self) -> dict:
    return {"arguments_bytes": self.arguments_bytes, "temp_bytes": self.temp_bytes, "output_bytes": self.output_bytes,
            "alias_bytes": self.alias_bytes, "total_bytes": self.total_bytes, "hbm_bytes": self.hbm_bytes,
            "compile_s": round(self.compile_s, 2), "model_flops": self.model_flops, "fits": self.fits,
            "error": self.error, "collectives_exact": self.collectives_exact,
            "collectives": {k: dataclasses.asdict(v) for k, v in self.collectives.items()}, "kernels": self.kernels}


def _family(pod: PodShape) -> str:
  m = re.fullmatch(r"(v4|v5p|v5e|v6e)-\d+", pod.name)
  if m is None:
    raise CompileError(f"--compile compiles for a TPU pod preset (v4-N, v5p-N, v5e-N, v6e-N); pod={pod.name!r} is "
                       "not one (GPU nodes and custom shapes: drop --compile)")
  return m.group(1)


def topology_name(pod: PodShape) -> str:
  """libtpu's topology name of a TPU preset: v5p-8 -> v5p:2x2x1, v5p-64 -> v5p:2x4x4, v6e-256 -> v6e:16x16."""
  family, chips = _family(pod), pod.devices
  if chips & (chips - 1):
    raise CompileError(f"pod={pod.name}: {chips} chips is not a power of two; no topology name to compile for")
  dims = [1, 1] if family in ("v5e", "v6e") else [1, 1, 1]
  while math.prod(dims) < chips:
    dims[dims.index(min(dims))] *= 2
  dims = sorted(dims)
  dims = [d for d in dims if d > 1] + [d for d in dims if d == 1]  # v5p:2x2x1, not 1x2x2
  return f"{family}:" + "x".join(map(str, dims))


def topology_devices(pod: PodShape):
  """The topology's devices (no TPU needed), or a one-line CompileError when libtpu is not installed."""
  if importlib.util.find_spec("libtpu") is None:
    raise CompileError("jaxpod plan --compile needs libtpu (the TPU compiler, at jax's own pin): "
                       "pip install 'jaxpod[tpu]'")
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # it compiles only: share libtpu with a running process
  from jax.experimental import topologies
  return topologies.get_topology_desc(platform="tpu", topology_name=topology_name(pod)).devices


def model_flops(cfg: LlamaConfig, rows: int, seq: int, backward: bool = True, forwards: int = 1) -> float:
  """Training flops of `rows` x `seq` tokens: 6 N tokens (N: the matmul weights, the embedding gather excluded)
  plus causal attention 6 L rows seq^2 H hd (2 N tokens and 2 L rows seq^2 H hd per forward without backward);
  `forwards`: extra forward-only passes (a frozen reference)."""
  n = cfg.num_params() - cfg.vocab_size * cfg.hidden_size * (0 if cfg.tie_word_embeddings else 1)
  attn = 2.0 * cfg.num_hidden_layers * rows * seq * seq * cfg.num_attention_heads * cfg.head_dim_  # fwd, causal
  fwd = 2.0 * n * rows * seq + attn
  return (3 * fwd if backward else fwd) + (forwards - 1) * fwd


def build_task(kind: str, cfg: LlamaConfig, wl: Workload, microbatches: int = 1):
  """The trainer task of the workload kind for `cfg`, built from its config alone (no data is read)."""
  from jaxpod.train.config import TrainConfig, TrainerConfig
  trainer = TrainerConfig(steps=1000, ema=wl.ema_decay, microbatches=microbatches)
  if kind == "train":
    from jaxpod.tasks.causal_lm import CausalLMConfig, LMTask, TextData
    cfg = dataclasses.replace(cfg, max_position_embeddings=max(cfg.max_position_embeddings, wl.seq_len))
    task = CausalLMConfig(model=cfg, data=TextData(seq_len=wl.seq_len, global_batch_size=wl.batch))
    return LMTask(TrainConfig(task=task, trainer=trainer))
  if kind == "preference":
    from jaxpod.tasks.preference import PairData, PreferenceConfig, PreferenceTask
    from jaxpod.tasks.preference_loss import LossConfig
    loss = LossConfig(kind="dpo", beta=0.1) if wl.reference else LossConfig()
    task = PreferenceConfig(model=cfg, loss=loss, data=PairData(path="plan.jsonl", max_length=wl.seq_len,
                                                                max_prompt_length=wl.seq_len // 2,
                                                                global_batch_size=wl.batch))
    return PreferenceTask(TrainConfig(task=task, trainer=trainer))
  from jaxpod.policy.spec import PolicyModelConfig, PolicySpec
  from jaxpod.rl.config import GRPOConfig
  from jaxpod.rl.grpo_task import GRPOTask, GRPOTaskConfig
  model = PolicyModelConfig(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(LlamaConfig)})
  task = GRPOTaskConfig(policy=PolicySpec(model), grpo=GRPOConfig(beta=REFERENCE_BETA if wl.reference else 0.0))
  return GRPOTask(TrainConfig(task=task, trainer=trainer), None)


def mesh_for(pod: PodShape, wl: Workload):
  from jaxpod.runtime.mesh import make_mesh
  devices = topology_devices(pod)
  try:
    return make_mesh(*wl.mesh.resolve(len(devices)), devices=devices)
  except ValueError as e:
    raise CompileError(f"{e} (topology {topology_name(pod)} has {len(devices)} devices)") from None


def _train_program(cfg: LlamaConfig, wl: Workload, mesh, microbatches: int):
  """(jitted step, abstract args, analytic flops) of the workload kind's train step."""
  import jax
  from jax.sharding import NamedSharding, PartitionSpec
  from jaxpod.train import state as st
  from jaxpod.train.step import batch_shardings, train_step_fn
  task = build_task(wl.kind, cfg, wl, microbatches)
  tx, lr = task.optimizer()
  graphdef = task.abstract_model(0)[0]
  abstract = st.abstract_state(st.make_init_fn(task, tx, 0, wl.batch, ema=wl.ema_decay > 0))
  shardings = st.train_state_shardings(abstract, mesh)
  batch = task.abstract_batch(wl.batch, wl.seq_len)
  batch_sh = batch_shardings(mesh, {k: v.ndim for k, v in batch.items()})
  step = train_step_fn(task.loss_fn(graphdef), tx, wl.ema_decay, lr, getattr(task, "updates_per_batch", 1),
                       microbatches, task.loss_normalizer)
  jitted = jax.jit(step, in_shardings=(shardings, batch_sh), out_shardings=(shardings, NamedSharding(mesh,
                   PartitionSpec())), donate_argnums=(0,))
  args = (st.with_shardings(abstract, shardings),
          {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=batch_sh[k]) for k, v in batch.items()})
  rows = wl.batch * (2 if wl.kind == "preference" else 1)
  flops = model_flops(cfg, rows, wl.seq_len - 1, forwards=2 if wl.reference else 1)
  return jitted, args, flops


_OOM = re.compile(r"RESOURCE_EXHAUSTED: ([^\n]*)")


def compile_program(name: str, jitted, args, mesh, hbm: int) -> Compiled:
  """Lower and compile under the mesh; the compiler's figures, or its out-of-memory line in `error`."""
  import jax
  out = Compiled(name, hbm_bytes=hbm)
  start = time.perf_counter()
  try:
    with jax.set_mesh(mesh):
      compiled = jitted.lower(*args).compile()
  except Exception as e:  # the TPU compiler refuses a program that does not fit: report, do not raise
    m = _OOM.search(str(e))
    if m is None:
      raise
    out.error, out.compile_s = m.group(1).strip(), time.perf_counter() - start
    return out
  out.compile_s = time.perf_counter() - start
  mem = compiled.memory_analysis()
  out.arguments_bytes, out.temp_bytes = mem.argument_size_in_bytes, mem.temp_size_in_bytes
  out.output_bytes, out.alias_bytes = mem.output_size_in_bytes, mem.alias_size_in_bytes
  hlo = compiled.as_text()
  out.collectives, out.collectives_exact = collectives(hlo)
  out.kernels = kernels(hlo)
  return out


def compile_programs(cfg: LlamaConfig, pod: PodShape, wl: Workload, microbatches: int = 1) -> list[Compiled]:
  """Every program of the run compiled for `pod` (see the module docstring)."""
  family = _family(pod)
  mesh = mesh_for(pod, wl)
  hbm = int(HBM_GIB[family] * GIB)
  jitted, args, flops = _train_program(cfg, wl, mesh, microbatches)
  train = compile_program("train", jitted, args, mesh, hbm)
  train.model_flops = flops / mesh.devices.size
  return [train]


def knob(c: Compiled, cfg: LlamaConfig, wl: Workload, rows_per_device: float, microbatches: int) -> str:
  """The first knob to turn when `c` does not fit."""
  if cfg.remat != "full":
    return f"--remat full (now {cfg.remat}: every layer's activations are kept for the backward pass)"
  if microbatches * 2 <= rows_per_device:
    return f"--microbatches {microbatches * 2} (one microbatch's activations live at a time)"
  if wl.mesh.fsdp != -1 and wl.mesh.data != 1:
    return "--mesh.data 1 --mesh.fsdp -1 (state sharded over every chip)"
  return f"fewer rows (--batch {wl.batch}) or a shorter --seq_len {wl.seq_len}, or a larger pod"


def describe(c: Compiled) -> str:
  """One line of the figures, in GiB."""
  if c.error:
    return f"{c.program}: does not fit ({c.error}); compile {c.compile_s:.0f} s"
  return (f"{c.program}: arguments {c.arguments_bytes / GIB:.2f} + temporaries {c.temp_bytes / GIB:.2f} + outputs "
          f"{c.output_bytes / GIB:.2f} - aliased {c.alias_bytes / GIB:.2f} = {c.total_bytes / GIB:.2f} GiB of "
          f"{c.hbm_bytes / GIB:.2f} per device; compile {c.compile_s:.1f} s; model {c.model_flops / 1e12:.1f} "
          "TFLOP per device per step")
