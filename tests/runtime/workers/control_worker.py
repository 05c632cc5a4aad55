"""Worker for the control-plane tests: `python control_worker.py SCENARIO`.

Prints `RESULT ...` lines the tests read, and `PEERFAILED host=H type=T` when it sees a peer fail.
"""
import json
import os
import sys
import time

import numpy as np

from jaxpod import runtime
from jaxpod.runtime import kv

scenario = sys.argv[1]
# barrier_timeout leaves host 1 asleep: a short shutdown barrier lets host 0 end soon after reporting.
host = runtime.init(runtime.RuntimeConfig(control_timeout_s=60,
                                          shutdown_timeout_s=2 if scenario == "barrier_timeout" else None))
me, n = host.process_index, host.process_count


def report(tag, value):
  print(f"{tag} {json.dumps(value)}", flush=True)


try:
  if scenario == "roundtrip":
    runtime.barrier("roundtrip.start", 60)
    assert runtime.init() is host  # idempotent
    from jaxpod.runtime.log import get_logger
    get_logger("worker").info("hello from the worker")
    value = runtime.broadcast({"seed": 1234, "arr": np.arange(6).reshape(2, 3)} if me == 0 else None, "cfg")
    report("BCAST", {"seed": value["seed"], "arr": value["arr"].tolist()})
    report("GATHER", runtime.allgather({"host": me, "sq": me * me}, "who"))
    report("LEADER_ONLY", runtime.leader_only(lambda: "wrote metrics")())
    report("CALL", runtime.broadcast_call(lambda: f"leader-{os.getpid() % 1}", "call"))
    for i in range(30):  # the same names again and again: keys must not pile up
      runtime.barrier("loop.barrier", 60)
      runtime.allgather(i, "loop.gather")
      runtime.broadcast(i, "loop.bcast")
    runtime.barrier("roundtrip.keys", 60)
    report("KEYS", len(kv.dir_get("jaxpod")))
    runtime.barrier("roundtrip.end", 60)

  elif scenario == "leader_fails_before_broadcast":
    with runtime.guard():
      if me == 0:
        raise ValueError("prompts file unreadable: /nope.jsonl")
      runtime.broadcast(None, "prompts", timeout_s=60)

  elif scenario == "leader_fn_raises_in_broadcast_call":
    def read():
      raise FileNotFoundError("tokenizer.json missing in /models/x")
    runtime.broadcast_call(read, "tokenize", timeout_s=60)

  elif scenario == "host_raises_mid_run":
    with runtime.guard():
      runtime.barrier("step.0", 60)
      if me == 1:
        raise RuntimeError("NaN loss at step 7")
      time.sleep(0.5)
      runtime.barrier("step.1", 60)

  elif scenario == "os_exit":
    runtime.barrier("before.exit", 60)
    if me == 1:
      os._exit(7)
    runtime.barrier("never.completes", 600)

  elif scenario == "barrier_timeout":
    if me == 1:
      time.sleep(30)
    runtime.barrier("late.host", timeout_s=3)

  elif scenario == "program_check":
    import jax.numpy as jnp
    from jaxpod.runtime import program_check
    if "JAXPOD_PROGRAM_CHECK" not in os.environ:  # else runtime.init() switched it on from the variable
      program_check.enable(True)
    step = runtime.jit(lambda x: (x * 2).sum(), name="train_step")
    step(jnp.ones((4, 8)))  # identical on every host: passes
    report("SAME_OK", True)
    rows = 4 + me  # a host-dependent shape: must be caught before running
    step(jnp.ones((rows, 8)))
    report("MISMATCH_NOT_CAUGHT", True)

  else:
    raise SystemExit(f"unknown scenario {scenario}")
except runtime.PeerFailed as e:
  report("PEERFAILED", {"host": e.host, "type": e.exc_type, "message": e.message})
  sys.exit(3)
except runtime.ControlTimeout as e:
  report("TIMEOUT", str(e))
  sys.exit(4)
except Exception as e:
  if type(e).__name__ == "ProgramMismatch":
    report("PROGRAM_MISMATCH", str(e))
    sys.exit(5)
  raise
