"""Peak resident memory growth of `jaxpod.io.verify(URL)` in a fresh process, then of restoring step 1's whole state
at once (what verify did before): prints {"growth": bytes, "whole": bytes, "report": verify's report}.

Usage: python verify_rss.py URL
"""
import json
import sys


def main() -> None:
  import orbax.checkpoint as ocp  # noqa: F401 - imported before the baseline
  from etils import epath
  from jaxpod.io import checkpoints
  from jaxpod.runtime.procstats import reset_peak, status_bytes
  url = sys.argv[1]
  growth = {}
  for name in ("growth", "whole"):
    reset_peak()
    base = status_bytes("VmRSS")
    if name == "growth":
      report = checkpoints.verify(url)
    else:
      ocp.StandardCheckpointHandler().restore(epath.Path(url) / "1" / "state")
    growth[name] = status_bytes("VmHWM") - base
  print(json.dumps({**growth, "report": report}))


if __name__ == "__main__":
  main()
