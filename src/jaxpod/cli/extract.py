"""`jaxpod extract`: layer activations over a prompt set, and `jaxpod extract info URL`.

    jaxpod extract --hf DIR --prompts FILE --layers 4,8 --out URL [--points resid,attn_out,mlp_out]
                   [--batch-size B] [--max-seq-len T] [--dtype bf16|f32] [--mesh.model 2 ...]
                   [--adapter PEFT_DIR]                              # LoRA: the adapted (merged) model's activations
    jaxpod launch --hosts 4 --devices-per-host 2 -- jaxpod extract ...     # simulated hosts
    jaxpod extract info URL
    jaxpod extract export URL --out DIR [--to arrow] [--keys resid.4]    # HF datasets-loadable Arrow files
"""
from __future__ import annotations

import dataclasses
import json


def run(cfg) -> int:
  """Extract on every host; the leader prints the totals."""
  from jaxpod import extract, runtime
  stats = extract.run(cfg)
  if runtime.is_leader():
    s = stats["seconds"]
    work = sum(v for k, v in s.items() if k != "setup")
    print(f"jaxpod extract: {stats['rows']} samples, {stats['tokens']} tokens in {work:.1f}s "
          f"({stats['tokens'] / max(work, 1e-9):.0f} tok/s) -> {cfg.out}")
  return 0


@dataclasses.dataclass(frozen=True)
class InfoOptions:
  """Options of `jaxpod extract info`."""

  url: str = ""  # dataset folder or URL
  json: bool = False  # print the summary as JSON

  def __post_init__(self):
    if not self.url:
      raise ValueError("extract info needs the dataset: jaxpod extract info URL")


def info(cfg: InfoOptions) -> int:
  """Print a dataset summary; exit 1 if rows are missing or repeated."""
  from jaxpod import extract
  from jaxpod.runtime import console
  ds = extract.open(cfg.url, strict=False)
  summary = ds.summary()
  if cfg.json:
    print(json.dumps(summary, indent=1))
  else:
    rows = [(k, json.dumps(v) if isinstance(v, (dict, list)) else str(v)) for k, v in summary.items()]
    console.print_table(f"activation dataset {cfg.url}", ("what", "value"), rows, header=False)
  return 0 if ds.completeness.ok else 1


@dataclasses.dataclass(frozen=True)
class ExportOptions:
  """Options of `jaxpod extract export`."""

  url: str = ""  # dataset folder or URL (a complete extraction)
  out: str = ""  # new folder or URL for the Arrow files and export.json
  to: str = "arrow"  # output format: arrow (Arrow IPC streams: datasets.load_dataset("arrow", ...))
  keys: tuple[str, ...] = ()  # captured tensors to export (CLI: --keys resid.4,mlp_out.4); () = all

  def __post_init__(self):
    if not self.url:
      raise ValueError("extract export needs the dataset: jaxpod extract export URL --out DIR")
    if not self.out:
      raise ValueError("extract export needs --out DIR (a new folder or bucket URL)")


def export(cfg: ExportOptions) -> int:
  """Write the dataset as Arrow files; print where and how many rows."""
  from jaxpod.extract.export import export as export_dataset
  record = export_dataset(cfg.url, cfg.out, to=cfg.to, keys=list(cfg.keys) or None)
  print(f"jaxpod extract export: {record['rows']} token rows x {len(record['columns'])} columns in "
        f"{len(record['files'])} file(s) -> {cfg.out}")
  return 0
