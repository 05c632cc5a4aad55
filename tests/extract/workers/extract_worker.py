"""Worker for the multi-host extraction tests, run on every host by `launch_hosts`.

    python extract_worker.py MODEL PROMPTS OUT DATA FSDP MODEL_AXIS BATCH FORWARD MEMORY [ACTION HOST BATCH]

FORWARD: sharded | exact; MEMORY: extract.device_memory_bytes (0: ask the device).

ACTION: `exit` (os._exit(3) right after committing that batch, like a preempted host) or
`raise` (a RuntimeError there, published to the other hosts). Prints `STATS {json}`.
"""
import json
import os
import sys

from jaxpod import extract, runtime
from jaxpod.runtime import MeshConfig

model, prompts, out = sys.argv[1:4]
data, fsdp, model_axis, batch = map(int, sys.argv[4:8])
forward, memory = sys.argv[8], int(sys.argv[9])
action, at_host, at_batch = ((sys.argv[10], int(sys.argv[11]), int(sys.argv[12])) if len(sys.argv) > 10
                              else (None, -1, -1))
cfg = extract.ExtractConfig(hf=model, prompts=prompts, layers=(0, 2), out=out, points=("resid", "attn_out", "mlp_out"),
                            batch_size=batch, max_seq_len=48, mesh=MeshConfig(data, fsdp, model_axis), progress=False,
                            forward=forward, device_memory_bytes=memory or None)


def on_batch(b):
  if b == at_batch and runtime.host_info().process_index == at_host:
    if action == "exit":
      os._exit(3)
    raise RuntimeError(f"disk full at batch {b}")


try:
  stats = extract.run(cfg, runtime.RuntimeConfig(control_timeout_s=60), on_batch=on_batch)
  print("STATS " + json.dumps({k: stats[k] for k in ("batches", "start_batch", "rows")}), flush=True)
except runtime.PeerFailed as e:
  print("PEERFAILED " + json.dumps({"host": e.host, "type": e.exc_type, "message": e.message}), flush=True)
  raise
