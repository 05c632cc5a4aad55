"""One simulated host of test_hf_io_scale.py / benchmarks: load a HF checkpoint from a URL into an FSDP mesh over
every device, then export it; print what this host moved.

    python hf_scale_worker.py CKPT_URL OUT_URL MAX_SHARD_BYTES [REFERENCE_FOLDER]

Prints `LOAD read=<bytes downloaded> wchar=<bytes written (files, some socket calls)> tmpfiles=<bytes of new files
under TMPDIR> ckpt=<checkpoint bytes>`,
`EQUAL <n tensors>` when REFERENCE_FOLDER is given (every addressable shard equals the whole-file read), and
`EXPORT gathered=<bytes assembled here> written=<bytes written> hwm_growth=<VmHWM rise, bytes> model=<bytes>`.
"""
from __future__ import annotations

import sys


def _tmp_files() -> dict[str, int]:
  """Every file under this host's temporary folder, with its size."""
  import os
  import tempfile
  out = {}
  for d, _, names in os.walk(tempfile.gettempdir()):
    for n in names:
      p = os.path.join(d, n)
      if os.path.isfile(p):
        out[p] = os.path.getsize(p)
  return out


def _check_equal(model, folder: str) -> int:
  """Each addressable shard of every parameter equals the same slice of the tensor read whole from the file."""
  import glob

  import numpy as np
  from flax import nnx
  from safetensors.numpy import load_file

  from jaxpod.models.llama import hf_io
  whole = {}
  for f in glob.glob(f"{folder}/*.safetensors"):
    whole.update(load_file(f))
  n = 0
  for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    x = var.get_value()
    want = np.stack([hf_io.from_hf(path, whole[name], shape) for name, _, shape in hf_io.per_layer(path, x.shape)])
    want = (want if hf_io.is_stacked_path(path) else want[0]).astype(x.dtype)
    for s in x.addressable_shards:
      np.testing.assert_array_equal(np.asarray(s.data), want[s.index], err_msg=str(path))
    n += 1
  return n


def main(argv):
  from jaxpod import runtime
  runtime.init(runtime.RuntimeConfig())
  import fsspec
  import jax
  from flax import nnx

  from jaxpod.io import safetensors_io
  from jaxpod.models.llama import hf_io
  from jaxpod.runtime import make_mesh
  from jaxpod.runtime.procstats import io_bytes, reset_peak, status_bytes
  ckpt, out, max_shard = argv[0], argv[1], int(argv[2])
  mesh = make_mesh(data=1, fsdp=-1)
  fs, root = fsspec.core.url_to_fs(ckpt)
  size = sum(fs.size(f) for f in fs.ls(root) if f.endswith(".safetensors"))
  safetensors_io.counters(reset=True)
  w0, tmp0 = io_bytes("wchar"), _tmp_files()
  model = hf_io.load(ckpt, mesh)
  read = safetensors_io.counters()["read"]
  tmp = sum(n for p, n in _tmp_files().items() if p not in tmp0)
  print(f"LOAD read={read} wchar={io_bytes('wchar') - w0} tmpfiles={tmp} ckpt={size}", flush=True)
  if len(argv) > 3:
    print(f"EQUAL {_check_equal(model, argv[3])}", flush=True)
  model_bytes = sum(x.nbytes for x in jax.tree.leaves(nnx.state(model)))
  hf_io.save(model, out + "/warm", max_shard_bytes=max_shard)  # compiles every program the export runs
  runtime.barrier("hf_scale_worker.warm", timeout_s=120)
  safetensors_io.counters(reset=True)
  reset_peak()
  base = status_bytes("VmHWM")
  hf_io.save(model, out, max_shard_bytes=max_shard)
  c = safetensors_io.counters()
  print(f"EXPORT gathered={c['gathered']} written={c['written']} hwm_growth={status_bytes('VmHWM') - base} model={model_bytes}",
        flush=True)
  runtime.barrier("hf_scale_worker.done", timeout_s=120)
  runtime.shutdown()


if __name__ == "__main__":
  main(sys.argv[1:])
