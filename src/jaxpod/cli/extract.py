"""`jaxpod extract`: layer activations over a prompt set, and `jaxpod extract info URL`.

    jaxpod extract --model DIR --prompts FILE --layers 4,8 --out URL [--points resid,attn_out,mlp_out]
                   [--batch-size B] [--max-seq-len T] [--dtype bf16|f32] [--mesh.model 2 ...]
    jaxpod launch --hosts 4 --devices-per-host 2 -- jaxpod extract ...     # simulated hosts
    jaxpod extract info URL
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
