"""`jaxpod bench scale`: what each simulated host reads, writes, holds and sends per phase (invariant 10).

A bf16 Llama (~1 GB by default: hidden 2048, 8 layers, vocab 32000) is written to a bucket of the test
GCS server (a real GCS-API server on 127.0.0.1); `--hosts` processes x 1 device then, FSDP over every
device: load it (`hf_io.load`), take one AdamW train step, publish it through the checkpoint transport
from a mesh that replicates it over groups of `--hosts_per_replica` hosts, and export it (`hf_io.save`).
Each host measures itself (`bench/scale/host.py`). Figures are multiples of the fair share
(model bytes / hosts): invariant 10 says each stays near 1. With `jaxpod plan`'s prediction beside.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile

from jaxpod.bench import common

PHASES = ("load", "train_step", "publish", "export")


@dataclasses.dataclass(frozen=True)
class ScaleBench:
  """Options of `jaxpod bench scale`."""

  hosts: int = 4  # simulated hosts, 1 device each, FSDP over all of them
  hidden: int = 2048  # model width (hidden 2048, 8 layers, vocab 32000: ~1 GB in bf16)
  layers: int = 8  # decoder layers
  vocab: int = 32000  # vocabulary size
  intermediate: int = 5632  # MLP width
  shard_mb: int = 256  # export shard size (HF's default is ~5 GB; smaller gives every host files)
  batch_per_host: int = 1  # train step rows per host
  seq: int = 128  # train step tokens per row
  hosts_per_replica: int = 2  # publish from data = hosts / this (each replica spans this many hosts)
  json: str | None = None  # write the results here

  def __post_init__(self):
    if self.hosts < 1 or self.hosts % self.hosts_per_replica:
      raise ValueError(f"--hosts={self.hosts} must be a positive multiple of --hosts_per_replica="
                       f"{self.hosts_per_replica}")


def _model_config(cfg: ScaleBench):
  from jaxpod.models.llama import LlamaConfig
  return LlamaConfig(vocab_size=cfg.vocab, hidden_size=cfg.hidden, intermediate_size=cfg.intermediate,
                     num_hidden_layers=cfg.layers, num_attention_heads=16, num_key_value_heads=8, dtype="bfloat16")


def run(cfg: ScaleBench) -> dict:
  """Write the model, run the hosts, print the table, write JSON; returns the results."""
  from jaxpod.models.llama import hf_io, init
  from jaxpod.runtime.gcs_emulator import GCSServer
  from jaxpod.runtime.launcher import LaunchConfig, launch
  model_cfg = _model_config(cfg)
  with GCSServer() as server, tempfile.TemporaryDirectory(prefix="jaxpod-bench-scale-") as tmp:
    os.environ.update(server.env())
    bucket = server.new_bucket("bench")
    hf_io.save(init(model_cfg, seed=0), f"{bucket}/ckpt")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("JAX_NUM_CPU_DEVICES", None)
    args = [f"{bucket}/ckpt", f"{bucket}/out", cfg.shard_mb << 20, cfg.batch_per_host, cfg.seq, cfg.hosts_per_replica]
    result = launch([sys.executable, "-m", "jaxpod.bench.scale.host", *map(str, args)],
                    LaunchConfig(hosts=cfg.hosts, devices_per_host=1, log_dir=f"{tmp}/logs", timeout_s=3600,
                                 hosts_root=f"{tmp}/hosts"), env=env, sink=None, summary=None)
    rows = sorted((json.loads(line.split("RESULT ", 1)[1]) for lines in result.output for line in lines
                   if "RESULT " in line), key=lambda r: r["host"])
    if result.returncode != 0 or len(rows) != cfg.hosts:
      tail = "\n".join(line for lines in result.output for line in lines[-15:])
      raise RuntimeError(f"bench scale: hosts failed (exit {result.returncode}):\n{tail}")
  results = {"config": dataclasses.asdict(cfg), "machine": common.machine(), "model_bytes": rows[0]["model"],
             "share_bytes": rows[0]["model"] / cfg.hosts, "hosts": rows, "plan": _plan(cfg, model_cfg)}
  _print(results)
  common.write_json(cfg.json, results)
  return results


def _plan(cfg: ScaleBench, model_cfg) -> dict:
  """`jaxpod plan`'s busiest-host bytes for the same model and pod shape: load read and export sent on the
  FSDP mesh, publish sent on the mesh the bench publishes from."""
  from jaxpod.plan import PodShape, Workload, make_plan
  from jaxpod.runtime.mesh import MeshConfig
  pod = PodShape(name="bench scale", hosts=cfg.hosts, devices_per_host=1, hbm_gb=64.0, host_ram_gb=64.0)
  batch = cfg.batch_per_host * cfg.hosts
  fsdp = make_plan(model_cfg, pod, Workload(mesh=MeshConfig(data=1, fsdp=-1), ema=0.0, batch=batch, seq_len=cfg.seq))
  replicated = make_plan(model_cfg, pod, Workload(kind="rl", colocated=False, publish=True, ema=0.0, batch=batch,
                                                  seq_len=cfg.seq, mesh=MeshConfig(data=cfg.hosts // cfg.hosts_per_replica,
                                                                                   fsdp=-1)))
  return {"load": fsdp.phase("load").read_per_host, "export": fsdp.phase("export").written_per_host,
          "publish": replicated.phase("publish").written_per_host}


def _print(results: dict) -> None:
  share = results["share_bytes"]
  model = results["model_bytes"]
  rows = []
  for r in results["hosts"]:
    for phase in PHASES:
      p = r[phase]
      rows.append([str(r["host"]), phase, f"{p['down'] / share:.2f}", f"{p['up'] / share:.2f}",
                   f"{p['wchar'] / share:.2f}", f"{p['hwm_growth'] / share:.2f}", f"{p['seconds']:.1f}"])
  common.print_table(f"bench scale: {model / 2**30:.2f} GiB bf16 model, {len(results['hosts'])} hosts x 1 device, "
                     f"share = model / hosts = {share / 2**20:.0f} MiB; figures in shares",
                     ["host", "phase", "down", "up", "local writes", "peak RSS +", "s"], rows)
  plan = results["plan"]
  if plan:
    measured = {
        "load": max(r["load"]["down"] for r in results["hosts"]),
        "publish": max(r["served"] for r in results["hosts"]),
        "export": max(r["export"]["up"] for r in results["hosts"]),
    }
    rows = [[k, f"{plan[k] / share:.2f}", f"{measured[k] / share:.2f}", f"{measured[k] / plan[k]:.2f}"]
            for k in measured if plan.get(k)]
    common.print_table("jaxpod plan vs measured (largest host, in shares)", ["phase", "plan", "measured", "ratio"],
                       rows)


def cli(cfg: ScaleBench) -> int:
  """Entry of `jaxpod bench scale`."""
  run(cfg)
  return 0
