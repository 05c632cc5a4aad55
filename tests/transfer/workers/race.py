"""Coordinator creation race: many of these start at once and call get_or_create_actor.

argv: ray_address namespace actor_name go_file. After joining Ray each writes
`ready-<pid>` beside go_file and waits for go_file, so all calls start together. Prints the actor id it got and
the caller count it saw (a call on the actor works).
"""
from __future__ import annotations

import os
import sys
import time

import ray

from jaxpod.transfer import coordinators  # no JAX import: starts fast


def main() -> None:
  address, namespace, name, go = sys.argv[1:5]
  ray.init(address=address, namespace=namespace, log_to_driver=False)
  with open(os.path.join(os.path.dirname(go), f"ready-{os.getpid()}"), "w"):
    pass
  while not os.path.exists(go):
    time.sleep(0.005)
  actor = coordinators.get_or_create_actor(coordinators.StoreActor, name, namespace)
  n = ray.get(actor.incr.remote("callers"), timeout=30)
  print(f"ACTOR {actor._actor_id.hex()} {n}", flush=True)
  os._exit(0)


if __name__ == "__main__":
  main()
