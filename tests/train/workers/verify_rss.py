"""Peak resident memory growth of `jaxpod.io.verify(URL)` in a fresh process, then of restoring step 1's whole state
at once (what verify did before): prints {"growth": bytes, "whole": bytes, "report": verify's report}.

Usage: python verify_rss.py URL
"""
import json
import re
import sys


def _status(key: str) -> int:
  with open("/proc/self/status") as f:
    return int(re.search(rf"{key}:\s+(\d+) kB", f.read()).group(1)) * 1024


def main() -> None:
  import orbax.checkpoint as ocp  # noqa: F401 - imported before the baseline
  from etils import epath
  from jaxpod.io import checkpoints
  url = sys.argv[1]
  growth = {}
  for name in ("growth", "whole"):
    with open("/proc/self/clear_refs", "w") as f:
      f.write("5")  # VmHWM := VmRSS
    base = _status("VmRSS")
    if name == "growth":
      report = checkpoints.verify(url)
    else:
      ocp.StandardCheckpointHandler().restore(epath.Path(url) / "1" / "state")
    growth[name] = _status("VmHWM") - base
  print(json.dumps({**growth, "report": report}))


if __name__ == "__main__":
  main()
