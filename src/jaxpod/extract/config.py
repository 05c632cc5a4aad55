"""`ExtractConfig`: what to extract, from which model, into which folder; validated before JAX init.

Two stages, both before anything touches a JAX backend (DESIGN.md invariant 7):
  - `__post_init__`: the fields on their own (unknown point, bad dtype, sizes < 1);
  - `check_inputs(cfg, hosts)`: the world they point at (model folder and its
    `num_hidden_layers`, prompt file, writable output, batch vs data-parallel size).
Every error is one line naming the field, the value received and the fix.
"""
from __future__ import annotations

import dataclasses
import json
import uuid
from typing import ClassVar

import fsspec

from jaxpod.runtime.hosts import HostInfo
from jaxpod.runtime.mesh import MeshConfig

POINTS = ("resid", "attn_out", "mlp_out")  # = jaxpod.models.llama.CAPTURE_POINTS (no JAX import here)
DTYPES = {"f32": "float32", "bf16": "bfloat16"}
FORWARDS = ("sharded", "exact")


@dataclasses.dataclass(frozen=True)
class ExtractConfig:
  """Options of `jaxpod extract` (one activation dataset per run)."""

  old_names: ClassVar[dict[str, str]] = {"model": "hf"}  # accepted, warned once (as `jaxpod sample --hf`)

  hf: str = ""  # HF checkpoint folder or fsspec URL (config.json + safetensors); families: models/llama/families
  adapter: str = ""  # PEFT LoRA adapter folder or URL on `hf` (as `jaxpod sample --adapter`), merged once
  prompts: str = ""  # prompt file: .txt (one prompt per line) or .jsonl ({"text": ...} or {"prompt": ...})
  layers: tuple[int, ...] = ()  # decoder blocks to capture, 0-based (CLI: --layers 4,8)
  out: str = ""  # output folder or fsspec URL (local, memory://, gs://); rerun with the same to resume
  points: tuple[str, ...] = ("resid",)  # capture points: resid (residual after block i), attn_out, mlp_out
  batch_size: int = 8  # prompts per global batch; a multiple of the data-parallel size (mesh data*fsdp)
  max_seq_len: int = 128  # prompts are truncated to this many tokens
  dtype: str = "f32"  # stored activation dtype: f32 | bf16 (the model computes in its checkpoint dtype)
  mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)  # (data, fsdp, model) sizes
  progress: bool = True  # progress bar on the leader
  forward: str = "sharded"  # sharded: full batch, weights stay sharded | exact: whole weights, same bytes on any mesh
  device_memory_bytes: int | None = None  # per-device memory the plan checks before compiling; None: ask the device
  memory_fraction: float = 0.9  # share of device memory the plan may use

  def __post_init__(self):
    for name, flag in (("hf", "--hf DIR"), ("prompts", "--prompts FILE"), ("out", "--out URL")):
      if not getattr(self, name):
        raise ValueError(f"extract.{name} is required: pass {flag}")
    if not self.layers:
      raise ValueError("extract.layers is empty: pass --layers 4,8 (0-based decoder block indices)")
    if len(set(self.layers)) != len(self.layers) or any(i < 0 for i in self.layers):
      raise ValueError(f"extract.layers={list(self.layers)}: give distinct block indices >= 0, e.g. --layers 4,8")
    bad = [p for p in self.points if p not in POINTS]
    if bad or not self.points or len(set(self.points)) != len(self.points):
      raise ValueError(f"extract.points={list(self.points)}: unknown or repeated point {bad or list(self.points)}; "
                       f"use distinct values from {','.join(POINTS)}")
    if self.dtype not in DTYPES:
      raise ValueError(f"extract.dtype={self.dtype!r} is not supported; use one of {'|'.join(DTYPES)}")
    if self.forward not in FORWARDS:
      raise ValueError(f"extract.forward={self.forward!r} is not supported; use one of {'|'.join(FORWARDS)}")
    if self.device_memory_bytes is not None and self.device_memory_bytes < 1:
      raise ValueError(f"extract.device_memory_bytes={self.device_memory_bytes} must be >= 1 "
                       "(or leave it unset to ask the device)")
    if not 0 < self.memory_fraction <= 1:
      raise ValueError(f"extract.memory_fraction={self.memory_fraction} must be in (0, 1]")
    if self.batch_size < 1:
      raise ValueError(f"extract.batch_size={self.batch_size} must be >= 1")
    if self.max_seq_len < 1:
      raise ValueError(f"extract.max_seq_len={self.max_seq_len} must be >= 1")

  @property
  def keys(self) -> tuple[str, ...]:
    """Dataset array names, `point.layer`, in a fixed order (layers ascending, then points)."""
    return tuple(f"{p}.{i}" for i in sorted(self.layers) for p in self.points)

  @property
  def np_dtype(self) -> str:
    return DTYPES[self.dtype]


# ---------------------------------------------------------------------------- checks before JAX init
def read_model_config(url: str) -> dict:
  """The checkpoint's config.json as a dict (no JAX), or a one-line error naming --hf."""
  fs, root = fsspec.core.url_to_fs(url)
  path = f"{root.rstrip('/')}/config.json"
  if not fs.exists(path):
    what = "does not exist" if not fs.exists(root) else "has no config.json"
    raise ValueError(f"extract.hf={url!r} {what}; point --hf at a HF checkpoint folder")
  with fs.open(path, "r") as f:
    return json.load(f)


def check_layers(cfg: ExtractConfig, num_layers: int) -> None:
  out = [i for i in cfg.layers if i >= num_layers]
  if out:
    raise ValueError(f"extract.layers={list(cfg.layers)}: {out} out of range; the model has {num_layers} blocks, "
                     f"use indices 0..{num_layers - 1}")


def check_writable(url: str, hosts: HostInfo) -> None:
  """Shared storage with several hosts (invariant 8); create the output folder and write + delete a probe file
  (per host: no two hosts share a name)."""
  from jaxpod.runtime import storage
  storage.check_shared(url, "extract.out", hosts.process_count)
  try:
    fs, root = fsspec.core.url_to_fs(url)
    fs.makedirs(root, exist_ok=True)
    probe = f"{root.rstrip('/')}/.probe-host{hosts.process_index}-{uuid.uuid4().hex[:8]}"
    fs.pipe_file(probe, b"ok")
    fs.rm_file(probe)
  except Exception as e:  # noqa: BLE001 - any storage error means the same to the user
    raise ValueError(f"extract.out={url!r} is not writable ({type(e).__name__}: {e}); choose a folder or "
                     "bucket you can write") from None


def check_batch(cfg: ExtractConfig, num_devices: int) -> None:
  """batch_size must split evenly over the data-parallel devices (mesh data * fsdp)."""
  try:
    data, fsdp, model = cfg.mesh.resolve(num_devices)
  except ValueError as e:
    raise ValueError(f"extract.{e}") from None
  dp = data * fsdp
  if cfg.batch_size % dp:
    raise ValueError(f"extract.batch_size={cfg.batch_size} is not divisible by the data-parallel size {dp} "
                     f"(mesh data={data} x fsdp={fsdp}); use a multiple of {dp} or change --mesh.*")


def check_inputs(cfg: ExtractConfig, hosts: HostInfo) -> dict:
  """Everything that can be checked before JAX init; returns the model's config.json dict."""
  hf = read_model_config(cfg.hf)
  from jaxpod.models.llama.config import LlamaConfig  # no backend: reads the dict through its family
  try:
    LlamaConfig.from_hf_config(hf)
  except (ValueError, KeyError) as e:
    raise ValueError(f"extract.hf={cfg.hf!r}: {e}") from None
  check_layers(cfg, int(hf["num_hidden_layers"]))
  if cfg.adapter:  # its names and shapes against the base's, in one line naming what does not fit
    from jaxpod.models.llama import peft_io
    try:
      peft_io.check_adapter(cfg.adapter, LlamaConfig.from_hf_config(hf))
    except ValueError as e:
      raise ValueError(f"extract.adapter={cfg.adapter!r}: {e}") from None
  fs, path = fsspec.core.url_to_fs(cfg.prompts)
  if not fs.isfile(path):
    raise ValueError(f"extract.prompts={cfg.prompts!r} is not a file; pass --prompts FILE (.txt or .jsonl)")
  check_writable(cfg.out, hosts)
  if hosts.devices_per_host is not None:  # simulated hosts: the device count is known now
    check_batch(cfg, hosts.process_count * hosts.devices_per_host)
  elif -1 not in cfg.mesh.sizes():
    check_batch(cfg, cfg.mesh.data * cfg.mesh.fsdp * cfg.mesh.model)
  return hf


def local_path(url: str) -> str | None:
  """The local path of a file:// or plain URL, else None."""
  fs, path = fsspec.core.url_to_fs(url)
  protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
  return path if "file" in protocols or "local" in protocols else None


def read_prompts(url: str) -> list[str]:
  """Prompts from a .txt (one per non-empty line) or .jsonl ("text" or "prompt" field) file."""
  from jaxpod.data.prompts import read_prompt_file
  return [r["prompt"] for r in read_prompt_file(url, "extract.prompts", keys=("text", "prompt"))]


