"""Run the RL loop example: a trainer process and a worker process, weights moved by jaxpod.transfer.

    python examples/rl_loop/run.py [--mode arrow_flight|ray|jax_transfer|checkpoint]

Starts a local Ray cluster on 127.0.0.1 for the Ray-coordinated modes (1 CPU, no dashboard),
runs both processes, prints their logs, and shuts everything down.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> int:
  p = argparse.ArgumentParser()
  p.add_argument("--mode", default="arrow_flight")
  p.add_argument("--steps", type=int, default=60)
  p.add_argument("--every", type=int, default=10)
  args = p.parse_args()
  flags = ["--mode", args.mode, "--steps", str(args.steps), "--every", str(args.every),
           "--folder", tempfile.mkdtemp(prefix="rl_loop-")]
  with contextlib.ExitStack() as stack:
    if args.mode != "checkpoint":
      from jaxpod.transfer import ray_local
      address = stack.enter_context(ray_local.local_cluster(num_cpus=1, include_dashboard=False,
                                                            log_to_driver=False))
      flags += ["--ray_address", address]
    env = dict(os.environ, JAX_PLATFORMS="cpu")  # after the cluster started: children join it on 127.0.0.1
    trainer = subprocess.Popen([sys.executable, os.path.join(HERE, "trainer.py"), *flags], env=env,
                               stdin=subprocess.PIPE)
    worker = subprocess.run([sys.executable, os.path.join(HERE, "worker.py"), *flags], env=env, timeout=300)
    trainer.stdin.close()
    return trainer.wait(timeout=60) or worker.returncode


if __name__ == "__main__":
  sys.exit(main())
