"""One simulated host exporting a sharded tiny Llama as a HF checkpoint, where host 1 goes wrong inside the export:

    python stuck_export_worker.py OUT_URL stall|raise STALL_TIMEOUT_S [HOST]

`stall`: host HOST (default 1) blocks forever once it received its first tensor (the others go on to the next wave's
all-to-all and wait there, inside a device collective); `raise`: it raises there instead. Prints `EXPORTED` if the
export ends.
"""
from __future__ import annotations

import sys
import threading
import time


def main(argv):
  from jaxpod import runtime
  out, mode, stall_s = argv[0], argv[1], float(argv[2])
  wrong_host = int(argv[3]) if len(argv) > 3 else 1
  runtime.init(runtime.RuntimeConfig(stall_timeout_s=stall_s))
  from flax import nnx

  from jaxpod.io import safetensors_io
  from jaxpod.models.llama import hf_io, init, tiny
  from jaxpod.models.llama.model import abstract
  from jaxpod.runtime import make_mesh, progress, state_shardings
  mesh = make_mesh(data=1, fsdp=-1)
  cfg = tiny()
  model = init(cfg, seed=0, shardings=state_shardings(nnx.split(abstract(cfg))[1], mesh))
  count = safetensors_io.count

  def goes_wrong(kind: str, n: int) -> None:  # that host, its first tensor received
    if kind == "gathered" and runtime.host_info().process_index == wrong_host:
      print("WRONG", time.time(), mode, flush=True)
      if mode == "raise":
        raise OSError("injected: the bucket refused the upload")
      threading.Event().wait()
    count(kind, n)

  safetensors_io.count = goes_wrong
  progress.mark("HF export")
  hf_io.save(model, out, max_shard_bytes=16 * 1024)  # many small files: several waves per host
  print("EXPORTED", flush=True)
  runtime.shutdown()


if __name__ == "__main__":
  main(sys.argv[1:])
