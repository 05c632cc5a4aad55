"""Worker for the prompt-file agreement test: each simulated host reads `problems.jsonl` from its own working
directory (its own disk, as on a pod). `python prompt_file_worker.py same|stale`: with `stale`, host 1's copy
has one answer changed, as a copy made before the file was fixed would."""
import json
import sys

from jaxpod import runtime
from jaxpod.problems.dataset import DatasetProblems
from jaxpod.policy.spec import check_same_problems

host = runtime.init(runtime.RuntimeConfig(control_timeout_s=60))
rows = [{"prompt": f"{a}+{a}=", "answer": str(2 * a)} for a in range(20)]
if sys.argv[1] == "stale" and host.process_index == 1:
  rows[7]["answer"] = "15"
with open("problems.jsonl", "w") as f:
  f.writelines(json.dumps(r) + "\n" for r in rows)
try:
  check_same_problems(DatasetProblems(path="problems.jsonl", eval_size=4), "trainer")
  print("AGREED", flush=True)
except ValueError as e:
  print(f"REFUSED {e}", flush=True)
  sys.exit(2)
