"""Worker for the per-host data test: `python rows_worker.py LM_ARGS_JSON PREF_ARGS_JSON`.

Every host builds the causal-LM task and the preference task from `jaxpod train` arguments; the leader
prepares their data (tokenized into row stores in the bucket) and broadcasts the payload; every host sets
up its loaders, draws one epoch of train batches and one eval pass, and prints `SEEN {json}`: per task the
bytes its row store fetched, the store's URL and a digest of every row it was given.
"""
import hashlib
import json
import sys

import numpy as np


def seen(loader, eval_batches) -> str:
  """sha256 over this host's train batches of one epoch, then its eval batches (arrays, names and dtypes)."""
  digest = hashlib.sha256()
  batches = [loader.train_batch(step) for step in range(loader.steps_per_epoch)] + list(eval_batches)
  for batch in batches:
    for name in sorted(batch):
      digest.update(name.encode() + str(batch[name].dtype).encode() + np.ascontiguousarray(batch[name]).tobytes())
  return digest.hexdigest()


def eval_batches(task):
  """The task's eval batches as its evaluator draws them."""
  if hasattr(task, "pc"):
    return task.loader.eval_iter(task.pc.data.eval_batch_size)
  return task.loader.eval_iter()


def main():
  from jaxpod import runtime
  from jaxpod.cli.train import load_config
  from jaxpod.train.task import make_task
  configs = [load_config(json.loads(a)) for a in sys.argv[1:]]
  host = runtime.init(configs[0].runtime, runs_dir=configs[0].trainer.runs_dir)
  out = {}
  with runtime.guard():
    for cfg in configs:
      task = make_task(cfg)
      prepared = runtime.broadcast_call(task.prepare, f"rows_worker.{task.name}", timeout_s=300)
      task.setup(prepared, host.process_index, host.process_count)
      digest = seen(task.loader, eval_batches(task))
      out[task.name] = {"bytes": task.loader.rows.bytes_read, "url": prepared["url"], "digest": digest,
                        "steps": task.loader.steps_per_epoch}
  print("SEEN", json.dumps(out), flush=True)
  runtime.shutdown()


if __name__ == "__main__":
  main()
