"""`jaxpod sample --model DIR --prompts FILE --out FILE [--mode global|replicated] [--max-new-tokens N]`.

Run it on every host (e.g. under `jaxpod launch`); the leader shows progress and writes the JSONL.
"""
from __future__ import annotations

from jaxpod.cli.args import parse
from jaxpod.sample.config import SampleConfig


def main(argv: list[str]) -> int:
  cfg = parse(SampleConfig, argv, "jaxpod sample")
  from jaxpod import runtime
  from jaxpod.sample.run import run
  with runtime.guard():
    run(cfg)
  runtime.shutdown()
  return 0
