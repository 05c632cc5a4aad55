"""Per-phase bytes of a run on a pod, as jaxpod moves them with every host doing only its share (invariant 10).

    from jaxpod.plan import make_plan, PodShape, Workload
    p = make_plan(model_cfg, PodShape.named("v5p-64"), Workload(mesh=MeshConfig(data=1, fsdp=-1)))
    p.phase("train").hbm_per_device, p.fits

Phases and what each assumes of the code (DESIGN.md invariant 10):
  load        each host reads, by byte range, the distinct shards its devices hold (model / hosts when
              the model is sharded over hosts); working set: the largest tensor's host share, twice
              (file dtype bytes in flight + the cast); no temporary files
  train       params + grads + optimizer state (+ EMA only at ema > 0, + a frozen reference), all in the weights'
              storage dtype (`param_dtype`: float32 master weights and moments), + activations in the compute
              dtype (an estimate of what the scanned layer stack keeps under `remat`: every layer's activations
              with none; each layer's input with full, plus one layer recomputed at a time; the vocab head by
              slices; no [T, T] scores where attention runs a kernel: splash on TPU, cuDNN on GPU) + what FSDP gathers for one layer at a time (its weights in the compute dtype, its float32
              gradients before the reduce-scatter) + a float32 gradient accumulator with microbatches > 1;
              `jaxpod plan --compile` gives the TPU compiler's own figure beside it
  kv          engines on the trainer's devices: weights resharded to the inference layout (replicated over
              data/fsdp, split over model) + KV pools split by data shard, next to the resident train state
  publish     each shard served once by one of the hosts holding it (bytes round-robin: ~model / hosts);
              snapshot of the params on device, upload in the background
  export      HF safetensors files assigned to hosts by bytes (~model / hosts each), written tensor by
              tensor: working set the largest tensor, twice
  checkpoint  Orbax: each host copies the shards it writes to host RAM (async) and uploads them; replicas
              split each shard between them (replica-parallel save, Orbax's default off GPU platforms)
"""
from __future__ import annotations

import dataclasses
import math

from jaxpod.models.llama.config import LlamaConfig, attention_kernel
from jaxpod.plan import model as pm
from jaxpod.plan.pods import GB, PodShape
from jaxpod.plan.shard import Layout, device_elements, host_bytes
from jaxpod.plan.workload import OPTIMIZERS, Workload

PHASES = ("load", "train", "kv", "publish", "export", "checkpoint")


@dataclasses.dataclass
class Phase:
  """Bytes of one phase: peak HBM per device, peak host RAM per host, bytes moved per host (worst host)."""

  name: str
  hbm_per_device: int  # peak device memory during the phase (what is resident + what the phase adds)
  ram_per_host: int  # host RAM the phase needs beyond the process itself
  read_per_host: int  # bytes downloaded from the bucket by the busiest host
  written_per_host: int  # bytes uploaded / sent by the busiest host
  parts: dict[str, int]  # hbm_per_device split by part (params, adam, kv, ...)
  active: bool = True  # False: the workload skips this phase (shown, not checked)
  problems: list[str] = dataclasses.field(default_factory=list)  # one line each: what does not fit and the knob
  notes: list[str] = dataclasses.field(default_factory=list)  # fits, but worth knowing (more than a host's share)


@dataclasses.dataclass
class Plan:
  """Everything `jaxpod plan` prints: the model, the pod, the mesh, and per-phase bytes."""

  model: dict
  pod: dict
  mesh: dict
  workload: dict
  params: int
  param_bytes: int
  share_per_host: int  # param_bytes / hosts
  kv_bytes_per_token: int
  phases: list[Phase]

  def phase(self, name: str) -> Phase:
    """The phase called `name`."""
    return next(p for p in self.phases if p.name == name)

  @property
  def problems(self) -> list[str]:
    return [f"{p.name}: {line}" for p in self.phases if p.active for line in p.problems]

  @property
  def fits(self) -> bool:
    return not self.problems

  def to_dict(self) -> dict:
    return {**dataclasses.asdict(self), "fits": self.fits, "problems": self.problems}


def _layout(pod: PodShape, wl: Workload) -> Layout:
  try:
    data, fsdp, model = wl.mesh.resolve(pod.devices)
  except ValueError as e:
    raise ValueError(f"{e} (pod has {pod.devices} devices)") from None
  return Layout(data, fsdp, model, pod.hosts)


VOCAB_SLICE = 8192  # vocabulary entries per slice of the loss's log-softmax (models/llama/loss.py)


def fused_attention(cfg: LlamaConfig, pod: PodShape) -> bool:
  """Whether attention runs a kernel that never writes the [T, T] scores on this pod (the model's own rule:
  config.attention_kernel, splash on TPU, cuDNN on GPU); a custom pod is assumed to run XLA."""
  try:
    return attention_kernel(cfg, pod.platform or "cpu", cfg.head_dim_, cfg.dtype) != "xla"
  except ValueError:  # a forced kernel this pod cannot run: the run refuses it in one line; plan with XLA's bytes
    return False


def _activations(cfg: LlamaConfig, wl: Workload, lay: Layout, itemsize: int, microbatches: int = 1,
                 fused: bool = False) -> int:
  """Activation bytes the backward pass needs on one device (estimate; see the module docstring)."""
  rows = math.ceil(math.ceil(wl.batch / (lay.data * lay.fsdp)) / microbatches)
  if wl.kind == "preference":
    rows *= 2  # chosen and rejected of each pair in one forward
  n, m, d = rows * wl.seq_len, lay.model, cfg.hidden_size
  hd, h, k = cfg.head_dim_, cfg.num_attention_heads, cfg.num_key_value_heads
  h_m = h // m if h % m == 0 else h
  dots = n * (d + (h_m + 2 * k) * hd + 3 * cfg.intermediate_size // m) * itemsize  # matmul outputs of a layer
  scores = rows * h_m * wl.seq_len ** 2 * (4 + itemsize)  # float32 scores and their probabilities
  if fused:  # the kernel keeps a float32 max and log-sum-exp per query, and its blocks
    scores = rows * h_m * wl.seq_len * 2 * 4
  per_layer = 3 * n * d * itemsize + dots + scores
  kept = {"none": cfg.num_hidden_layers * per_layer, "dots": cfg.num_hidden_layers * (n * d * itemsize + dots),
          "full": cfg.num_hidden_layers * n * d * itemsize, "offload": cfg.num_hidden_layers * n * d * itemsize}
  recomputed = 0 if cfg.remat == "none" else per_layer  # one layer's forward again, inside its backward
  head = 2 * n * min(VOCAB_SLICE, cfg.vocab_size) * 4 + 2 * n * d * 4  # one slice's logits + grads, the head input
  return kept[cfg.remat] + recomputed + head


def _fsdp_working_set(ts, lay: Layout, itemsize: int, layers: int) -> int:
  """One layer's weights gathered in the compute dtype and its float32 gradients before they are reduce-scattered
  (none without fsdp)."""
  if lay.fsdp == 1:
    return 0
  block = sum(t.size for t in ts if t.axes and t.axes[0] == "layers") // max(layers, 1)
  return block // lay.model * (itemsize + 4)


def _min_fsdp(sharded: int, fixed: int, limit: int, lay: Layout, pod: PodShape) -> int | None:
  """The smallest fsdp (a divisor of devices / model) at which `sharded` bytes (now split lay.fsdp ways) plus
  `fixed` fit in `limit`; None if none does."""
  room = pod.devices // lay.model
  for f in range(1, room + 1):
    if room % f == 0 and sharded * lay.fsdp // f + fixed <= limit:
      return f
  return None


def make_plan(cfg: LlamaConfig, pod: PodShape, wl: Workload, microbatches: int = 1) -> Plan:
  """Per-phase bytes of `wl` with model `cfg` on `pod` (no JAX, no files)."""
  lay = _layout(pod, wl)
  ts = pm.tensors(cfg)
  item = pm.ITEMSIZE[cfg.param_dtype_]  # the state's storage dtype (float32 master weights and moments)
  total = sum(t.size for t in ts) * item
  params_dev = sum(device_elements(t, lay) for t in ts) * item
  hb = host_bytes(ts, lay, item)
  needed, served = hb.needed, hb.served
  per_layer = pm.tensors(cfg, stacked_layers=False)  # what a load or an export holds at a time: one layer's tensor
  layer_largest = host_bytes(per_layer, lay, item).largest
  largest_host = hb.largest  # a publish moves whole (stacked) leaves
  largest = max(t.size for t in per_layer) * item
  hbm = int(pod.hbm_gb * GB * wl.memory_fraction)
  ram = int(pod.host_ram_gb * GB * wl.memory_fraction)
  slots = OPTIMIZERS[wl.optimizer]
  ema = wl.ema_decay > 0
  state_parts = {"params": params_dev, "optimizer": slots * params_dev, "ema": params_dev if ema else 0,
                 "reference": params_dev if wl.reference else 0}
  resident = sum(state_parts.values())
  compute = pm.ITEMSIZE[cfg.dtype]
  acts = _activations(cfg, wl, lay, compute, microbatches, fused_attention(cfg, pod))
  gathered = _fsdp_working_set(ts, lay, compute, cfg.num_hidden_layers)
  accumulator = sum(device_elements(t, lay) for t in ts) * 4 if microbatches > 1 else 0
  phases = []

  load = Phase("load", params_dev, 2 * layer_largest, int(needed.max()), 0,
               {"params": params_dev})
  phases.append(load)

  train = Phase("train", resident + params_dev + acts + gathered + accumulator, 0, 0, 0,
                {**state_parts, "grads": params_dev, "activations (est.)": acts, "fsdp gathered": gathered,
                 "accumulator": accumulator})
  phases.append(train)

  kv_tok = pm.kv_bytes_per_token(cfg)
  kv_split = lay.model if cfg.num_key_value_heads % lay.model == 0 else 1
  rows = math.ceil(wl.engine_rows / (lay.data * lay.fsdp)) if wl.engine_rows else 0
  kv_dev = wl.kv_engines * rows * wl.engine_len * kv_tok // kv_split
  engine_w = sum(device_elements(t, lay, drop=("data", "fsdp")) for t in ts) * item if rows else 0
  kv = Phase("kv", resident + engine_w + kv_dev, 0, 0, 0,
             {**state_parts, "engine weights": engine_w, "kv cache": kv_dev}, active=bool(rows))
  phases.append(kv)

  publish = Phase("publish", resident + params_dev, 2 * largest_host, 0, int(served.max()),
                  {**state_parts, "snapshot": params_dev}, active=wl.publishes)
  phases.append(publish)

  per_file = math.ceil(total / pod.hosts)
  export = Phase("export", resident, 2 * largest, 0, per_file, dict(state_parts), active=wl.export)
  phases.append(export)

  copies = 1 + slots + int(ema) + int(wl.reference)
  ckpt_host = copies * int(hb.split.max())
  checkpoint = Phase("checkpoint", resident, ckpt_host, 0, ckpt_host, dict(state_parts))
  checkpoint.notes.append(f"the bucket keeps keep_last={wl.keep_last} x {_gb(copies * total)} (params x {copies}) = "
                          f"{_gb(wl.keep_last * copies * total)}")
  phases.append(checkpoint)

  _check(cfg, pod, wl, lay, phases, hbm, ram, resident, acts + gathered + accumulator, params_dev, total)
  return Plan(model={k: v for k, v in dataclasses.asdict(cfg).items()
                     if k in ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                              "num_attention_heads", "num_key_value_heads", "head_dim", "tie_word_embeddings",
                              "dtype")},
              pod=dataclasses.asdict(pod), mesh={"data": lay.data, "fsdp": lay.fsdp, "model": lay.model},
              workload={**dataclasses.asdict(wl), "ema": wl.ema_decay, "publish": wl.publishes},
              params=sum(t.size for t in ts), param_bytes=total, share_per_host=total // pod.hosts,
              kv_bytes_per_token=kv_tok, phases=phases)


def _gb(x: float) -> str:
  return f"{x / GB:.2f} GB" if x < 10 * GB else f"{x / GB:.1f} GB"


def _check(cfg, pod: PodShape, wl: Workload, lay: Layout, phases: list[Phase], hbm: int, ram: int, resident: int,
           acts: int, params_dev: int, total: int) -> None:
  """Fill each phase's problems: one line naming what does not fit and the knob that fixes it."""
  load, train, kv, publish, export, checkpoint = phases
  limit = f"{wl.memory_fraction:g} x {pod.hbm_gb:g} GB HBM"
  if load.hbm_per_device > hbm:
    f = _min_fsdp(params_dev, 0, hbm, lay, pod)
    load.problems.append(f"the parameters alone are {_gb(params_dev)} per device > {limit}; "
                         + (f"raise --mesh.fsdp to >= {f}" if f else "raise --mesh.model or use more devices"))
  state = train.hbm_per_device - acts
  if state > hbm:
    f = _min_fsdp(state, 0, hbm, lay, pod)
    train.problems.append(
        f"params + grads + optimizer{' + EMA' if wl.ema_decay > 0 else ''}{' + reference' if wl.reference else ''} = "
        f"{_gb(state)} per device > {limit}; "
        + (f"raise --mesh.fsdp to >= {f} (data = devices / (fsdp x model))" if f else
           "raise --mesh.model or use more devices") + ("; --ema 0 drops the EMA copy" if wl.ema_decay > 0 else ""))
  elif train.hbm_per_device > hbm:
    train.problems.append(f"activations (est.) {_gb(acts)} + state {_gb(state)} per device > {limit}; lower "
                          f"--batch={wl.batch} or --seq_len={wl.seq_len} (rows per device do not shrink with fsdp), "
                          "or raise --mesh.model")
  if kv.active and kv.hbm_per_device > hbm:
    w, c = kv.parts["engine weights"], kv.parts["kv cache"]
    knob = ("raise --mesh.model (the inference layout replicates the weights over data and fsdp)" if w >= c else
            f"lower --kv_rows ({wl.engine_rows}) or --kv_len ({wl.engine_len}), or raise --mesh.model")
    kv.problems.append(f"train state {_gb(resident)} + engine weights {_gb(w)} + KV {_gb(c)} per device > {limit}; "
                       f"{knob}")
  if publish.active and publish.hbm_per_device > hbm and state <= hbm:
    publish.problems.append(f"state + snapshot {_gb(publish.hbm_per_device)} per device > {limit}; raise --mesh.fsdp")
  ram_limit = f"{wl.memory_fraction:g} x {pod.host_ram_gb:g} GB host RAM"
  for p in phases:
    if p.active and p.ram_per_host > ram:
      knob = ("--ema 0 drops the EMA copy, or use more hosts" if p.name == "checkpoint"
              else "use more hosts or a larger --host_ram_gb")
      p.problems.append(f"{_gb(p.ram_per_host)} of host RAM per host > {ram_limit}; {knob}")
  if load.read_per_host > 1.5 * total / pod.hosts and pod.hosts > 1:
    load.notes.append(f"each host reads {_gb(load.read_per_host)} ({load.read_per_host * pod.hosts / total:.1f}x "
                      f"its share {_gb(total / pod.hosts)}): the mesh replicates parameters across hosts (every "
                      "host's devices need them all); fsdp over the hosts reads model / hosts each")
