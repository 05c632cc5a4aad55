"""`jaxpod plot RUN_DIR [--out FILE]`: loss and accuracy curves of a run to a PNG."""
from __future__ import annotations

from jaxpod.cli.args import parse


def main(argv: list[str]) -> int:
  from jaxpod.train.plot import PlotConfig, plot_run
  argv = list(argv)
  if argv and not argv[0].startswith("--"):
    argv = ["--run_dir", argv[0], *argv[1:]]
  cfg = parse(PlotConfig, argv, "jaxpod plot")
  print(plot_run(cfg.run_dir, cfg.out))
  return 0
