"""`jaxpod plan`: options, the table, JSON.

    jaxpod plan --model llama-3-70b --pod v5p-64 --mesh.data 1 --mesh.fsdp -1
    jaxpod plan --model gs://bucket/ckpt --pod v5e-256 --kind rl --kv_rows 256 --kv_len 4096 --json plan.json
    jaxpod plan --model runs/cfg.yaml --hosts 4 --devices_per_host 1 --hbm_gb 16 --host_ram_gb 64
    jaxpod plan --model llama-3-8b --pod v5p-64 --mesh.data 1 --mesh.fsdp -1 --batch 32 --seq_len 4096 \
        --remat full --param_dtype float32 --ema 0 --compile      # the TPU compiler's figures too (libtpu)

Without --compile the plan is pure Python and numpy; with it, `plan.compile` builds and compiles the run's
programs for the pod's TPU topology (needs libtpu: `pip install 'jaxpod[tpu]'`).

Exit 0 when every phase fits, 1 when one does not (each named in one line with its knob), 2 on bad input.
"""
from __future__ import annotations

import dataclasses
import json

from jaxpod.plan.model import resolve
from jaxpod.plan.phases import Plan, make_plan
from jaxpod.plan.pods import GB, PodShape
from jaxpod.plan.workload import Workload

_DESCRIBE = {"load": "ranged reads of this host's shards",
             "train": "state + grads + activations (est.)",
             "kv": "engine weights + KV, next to the state",
             "publish": "per step, spread over replicas",
             "export": "HF files, ~model / hosts each",
             "checkpoint": "Orbax shards: RAM copy, upload"}


@dataclasses.dataclass(frozen=True)
class PlanOptions(Workload):
  """Options of `jaxpod plan`: the model, the pod shape (a preset, fields override it), the workload."""

  model: str = ""  # preset (llama-3-8b, llama-3-70b, qwen2.5-32b), config.json path/URL, checkpoint folder, or workload YAML
  pod: str = ""  # pod preset: v5p-64, v5e-256, h100x8, ... ("": give hosts, devices_per_host, hbm_gb, host_ram_gb)
  hosts: int = 0  # hosts (0: the preset's)
  devices_per_host: int = 0  # devices per host (0: the preset's)
  hbm_gb: float = 0.0  # HBM per device in GB (0: the preset's)
  host_ram_gb: float = 0.0  # host RAM per host in GB (0: the preset's)
  dtype: str = ""  # compute dtype override (and the weights' unless param_dtype): bfloat16 | float32 ("": the config's)
  param_dtype: str = ""  # weights' and optimizer moments' storage dtype (float32: master weights) ("": dtype)
  remat: str = ""  # activations kept for the backward pass: none | full | dots | offload ("": the config's)
  layers: int = 0  # decoder layers override, for quick compiles (0: the config's)
  microbatches: int = 1  # gradient accumulation inside the step (trainer.microbatches)
  compile: bool = False  # also compile the run's programs for the pod with the TPU compiler (libtpu) and compare
  json: str | None = None  # also write the plan here as JSON

  def __post_init__(self):
    super().__post_init__()
    if not self.model:
      raise ValueError("model is required: --model llama-3-70b (a preset), a config.json path or URL, a checkpoint "
                       "folder, or a workload YAML")
    if self.layers < 0 or self.microbatches < 1:
      raise ValueError(f"layers={self.layers}, microbatches={self.microbatches}: expected layers >= 0 (0: the "
                       "config's) and microbatches >= 1")
    if self.batch % self.microbatches:
      raise ValueError(f"batch={self.batch} is not a multiple of microbatches={self.microbatches}")
    for name in ("hosts", "devices_per_host", "hbm_gb", "host_ram_gb"):
      if getattr(self, name) < 0:
        raise ValueError(f"{name}={getattr(self, name)}: expected > 0 (or 0: the preset's)")
    if not self.pod and not all(getattr(self, n) for n in ("hosts", "devices_per_host", "hbm_gb", "host_ram_gb")):
      raise ValueError("pod is required: --pod v5p-64 (a preset), or all of --hosts, --devices_per_host, --hbm_gb, "
                       "--host_ram_gb")

  def pod_shape(self) -> PodShape:
    """The preset with any field given here replacing its value."""
    base = PodShape.named(self.pod) if self.pod else PodShape()
    given = {n: getattr(self, n) for n in ("hosts", "devices_per_host", "hbm_gb", "host_ram_gb") if getattr(self, n)}
    name = base.name if not given else f"{self.pod} (changed)" if self.pod else "custom"
    return dataclasses.replace(base, **given, name=name)

  def model_config(self):
    """The model with the options' dtype, param_dtype, remat and layers applied."""
    cfg = resolve(self.model)
    given = {"dtype": self.dtype, "param_dtype": self.param_dtype, "remat": self.remat,
             "num_hidden_layers": self.layers}
    cfg = dataclasses.replace(cfg, **{k: v for k, v in given.items() if v})
    if cfg.layer_types and len(cfg.layer_types) != cfg.num_hidden_layers:
      cfg = dataclasses.replace(cfg, layer_types=cfg.layer_types[:cfg.num_hidden_layers])
    return cfg

  def workload(self) -> Workload:
    """The Workload fields alone."""
    return Workload(**{f.name: getattr(self, f.name) for f in dataclasses.fields(Workload)})


def plan_for(options: PlanOptions) -> Plan:
  """The plan `jaxpod plan` prints for these options (importable: `bench scale` compares against it)."""
  return make_plan(options.model_config(), options.pod_shape(), options.workload(), options.microbatches)


def _gb(x: int) -> str:
  return "-" if not x else f"{x / GB:,.2f}" if x < 10 * GB else f"{x / GB:,.1f}"


def print_plan(p: Plan, stream=None) -> None:
  """The plan as one table (GB per device / per host, worst host) and one line per problem."""
  from jaxpod.runtime.console import _console, table
  pod, m, w = p.pod, p.mesh, p.workload
  title = (f"{p.model['model_type']} {p.params / 1e9:.2f} B params, {p.param_bytes / GB:.1f} GB {p.model['dtype']}, "
           f"on {pod['name']} ({pod['hosts']} hosts x {pod['devices_per_host']}, {pod['hbm_gb']:g} GB HBM, "
           f"{pod['host_ram_gb']:g} GB RAM)")
  rows = []
  for ph in p.phases:
    if not ph.active:
      rows.append((ph.name, "-", "-", "-", "-", "skipped", _DESCRIBE[ph.name]))
      continue
    status = "NO" if ph.problems else "ok"
    rows.append((ph.name, _gb(ph.hbm_per_device), _gb(ph.ram_per_host), _gb(ph.read_per_host),
                 _gb(ph.written_per_host), status, _DESCRIBE[ph.name]))
  console = _console(stream)
  console.print(f"mesh data={m['data']} fsdp={m['fsdp']} model={m['model']}; {w['kind']}, {w['optimizer']}, "
                f"ema={w['ema']:g}, reference={w['reference']}, batch {w['batch']} x {w['seq_len']}"
                + (f", KV {w['kv_engines']} x {w['kv_rows'] or w['batch']} rows x {w['kv_len'] or w['seq_len']}"
                   if p.phase("kv").active else ""), highlight=False, soft_wrap=True)
  console.print(table(title, ["phase", "HBM/device GB", "RAM/host GB", "read/host GB", "sent/host GB", "fits",
                              "what"], rows))
  train = p.phase("train").parts
  console.print("train state per device: " + ", ".join(f"{k} {v / GB:.2f} GB" for k, v in train.items() if v)
                + f"; share per host (model / hosts) {p.share_per_host / GB:.2f} GB; KV "
                  f"{p.kv_bytes_per_token / 1e3:.0f} KB per token", highlight=False, soft_wrap=True)
  for ph in p.phases:
    if ph.active:
      for line in ph.problems:
        console.print(f"does not fit: {ph.name}: {line}", highlight=False, soft_wrap=True)
      for line in ph.notes:
        console.print(f"note: {ph.name}: {line}", highlight=False, soft_wrap=True)


def print_compiled(p: Plan, results: list, options: PlanOptions, stream=None) -> None:
  """Per program: the compiler's figures beside the analytic plan's, collectives, and a knob when it does not fit."""
  from jaxpod.plan import compile as pc
  from jaxpod.runtime.console import _console
  console = _console(stream)
  cfg, wl = options.model_config(), options.workload()
  rows = wl.batch / (p.mesh["data"] * p.mesh["fsdp"])
  for c in results:
    console.print(f"compiled {pc.describe(c)}", highlight=False, soft_wrap=True)
    if c.program == "train":
      est = p.phase("train").hbm_per_device
      ratio = f" ({est / c.total_bytes:.2f}x the compiled)" if c.total_bytes and not c.error else ""
      console.print(f"  analytic plan: train {est / pc.GIB:.2f} GiB per device{ratio}", highlight=False)
    if c.collectives:
      found = ", ".join(f"{k} {v.executed} ({v.bytes / pc.GIB:.2f} GiB)" for k, v in c.collectives.items()
                        if v.executed)
      console.print(f"  collectives per step per device: {found or 'none'}"
                    + ("" if c.collectives_exact else " (a loop bound unread: counted once)"), highlight=False,
                    soft_wrap=True)
    if not c.error:
      found = ", ".join(f"{k} x{n}" for k, n in c.kernels.items())
      console.print(f"  kernels: {found or 'none (XLA attention)'}", highlight=False, soft_wrap=True)
    if not c.fits:
      need = c.error or f"{c.total_bytes / pc.GIB:.2f} GiB > {c.hbm_bytes / pc.GIB:.2f} GiB HBM"
      console.print(f"does not fit: compiled {c.program}: {need}; turn {pc.knob(c, cfg, wl, rows, options.microbatches)}",
                    highlight=False, soft_wrap=True)


def cli(options: PlanOptions) -> int:
  """`jaxpod plan`: print the table (and JSON); exit 1 if a phase (or, with --compile, a program) does not fit."""
  p = plan_for(options)
  print_plan(p)
  out, fits = p.to_dict(), p.fits
  if options.compile:
    from jaxpod.plan import compile as pc
    try:
      results = pc.compile_programs(options.model_config(), options.pod_shape(), options.workload(),
                                    options.microbatches)
    except pc.CompileError as e:
      print(f"jaxpod plan --compile: {e}")
      return 2
    print_compiled(p, results, options)
    out["compiled"] = {c.program: c.to_dict() for c in results}
    fits = fits and all(c.fits for c in results)
  if options.json:
    import fsspec
    with fsspec.open(options.json, "w") as f:
      json.dump(out, f, indent=1)
  return 0 if fits else 1
