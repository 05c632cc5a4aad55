"""A training run on every simulated host: `train_worker.py MODE [jaxpod train args...]`.

MODE: `run`, `raise:HOST:STEP` (that host raises at that step), `exit:HOST:STEP` (that host
dies with os._exit(7), without a word) or `sigterm:HOST:STEP` (that host gets a preemption notice). The leader prints `SUMMARY {json}`; a host that sees a
peer fail prints `PEERFAILED {json}`.
"""
import dataclasses
import json
import os
import signal
import sys

from jaxpod import runtime
from jaxpod.cli.train import load_config
from jaxpod.train import Hook, train


class Fail(Hook):
  def __init__(self, how: str, host: int, step: int):
    self.every, self.how, self.host, self.step = 1, how, host, step

  def __call__(self, info):
    if info.step == self.step and runtime.host_info().process_index == self.host:
      if self.how == "exit":
        os._exit(7)
      if self.how == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)
        return
      raise RuntimeError(f"injected failure at step {info.step}")


def main():
  mode, argv = sys.argv[1], sys.argv[2:]
  hooks = []
  if mode != "run":
    how, host, step = mode.split(":")
    hooks.append(Fail(how, int(host), int(step)))
  cfg = load_config(argv)
  try:
    summary = train(cfg, extra_hooks=hooks)
  except runtime.PeerFailed as e:
    print("PEERFAILED", json.dumps({"host": e.host, "type": e.exc_type, "message": e.message}), flush=True)
    raise
  if runtime.is_leader():
    print("SUMMARY", json.dumps(dataclasses.asdict(summary), default=str), flush=True)
  from jaxpod.runtime import compile_cache, kv
  print("KVMAX", kv.MAX_VALUE_BYTES, flush=True)  # the largest control-plane value this host sent
  print("CACHE", json.dumps({"hits": compile_cache.STATS.hits, "misses": compile_cache.STATS.misses}), flush=True)
  runtime.shutdown()


if __name__ == "__main__":
  main()
