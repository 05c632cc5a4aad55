"""Worker for the multi-host loader test: `python loader_worker.py DATASET GLOBAL_BATCH`.

Each host loads its own rows (shard from jax.process_index), assembles global arrays on a
data-parallel mesh and prints the gathered global batches as `BATCH [...]` lines.
"""
import json
import sys

from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxpod import runtime
from jaxpod.data.sudoku import SudokuLoader, make_global_batch, validate_batch

path, global_batch = sys.argv[1], int(sys.argv[2])
host = runtime.init(runtime.RuntimeConfig())
with runtime.guard():
  import jax
  validate_batch(global_batch, hosts=host.process_count, data_parallel=jax.device_count())
  sharding = NamedSharding(runtime.make_mesh(data=-1), P("data"))
  loader = SudokuLoader(path, global_batch, seed=1)
  it = loader.train_iter()
  for _ in range(3):
    batch = make_global_batch(next(it), sharding)
    assert batch["inputs"].shape == (global_batch, loader.metadata["seq_len"])
    print("BATCH", json.dumps(multihost_utils.process_allgather(batch["inputs"], tiled=True).tolist()), flush=True)
  print("STATE", json.dumps(it.get_state()), flush=True)
  masks = [multihost_utils.process_allgather(make_global_batch(b, sharding)["mask"], tiled=True).sum()
           for b in loader.eval_iter()]
  print("EVAL", json.dumps([int(m) for m in masks]), flush=True)
runtime.shutdown()
