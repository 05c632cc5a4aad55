"""`jaxpod doctor [--runtime.program_check true]`: hosts, devices, mesh, collective, barrier, cache."""
from __future__ import annotations

import sys

from jaxpod.cli.args import parse
from jaxpod.runtime.doctor import DoctorConfig, run


def main(argv: list[str]) -> int:
  checks = run(parse(DoctorConfig, argv, "jaxpod doctor"))
  bad = [c for c in checks if not c.ok]
  if bad:
    print("jaxpod doctor: " + "; ".join(f"{c.name}: {c.detail}" for c in bad), file=sys.stderr)
    return 1
  return 0
