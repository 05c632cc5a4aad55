"""Export an activation dataset to Arrow files that HF `datasets` (and pyarrow, polars, ...) load.

    jaxpod extract export gs://b/acts --out gs://b/acts-arrow
    ds = datasets.load_dataset("arrow", data_files="acts-arrow/data-*.arrow", split="train")
    ds = datasets.Dataset.from_file("acts-arrow/data-00000.arrow")   # memory-mapped, no copy

One row per real token (padding dropped; the unit SAE training samples): `prompt_id` (row of
the prompt file), `position` (token index in the prompt), `token` (id), then one column per
captured tensor named by its jaxpod key ("resid.4": a fixed-size list of hidden_size floats).
bfloat16 activations are widened to float32 (exact; Arrow has no bfloat16). Shards are read one
extraction batch at a time and written as Arrow IPC streams (what `datasets` itself writes),
a new file past `max_file_bytes`; nothing holds more than one batch in memory. `export.json`
beside them records the source, the columns and `HF_NAMES` (jaxpod key -> HF / TransformerLens).
"""
from __future__ import annotations

import json

import fsspec
import numpy as np

from jaxpod.extract.reader import Dataset
from jaxpod.runtime import storage

FORMATS = ("arrow",)
MAX_FILE_BYTES = 512 * 2**20  # start a new data file past this size


def hf_names(key: str, num_layers: int) -> dict[str, str]:
  """Where an HF Llama (and TransformerLens, as SAELens names it) exposes the tensor of a jaxpod key."""
  point, layer = key.split(".")
  i = int(layer)
  if point == "resid":
    hs = f"hidden_states[{i + 1}]" + (" before the final norm (HF's last entry is after it)"
                                      if i + 1 == num_layers else "")
    return {"transformers": f"output_hidden_states=True: {hs}; forward hook on model.layers.{i} (output[0])",
            "transformer_lens": f"blocks.{i}.hook_resid_post"}
  module = {"attn_out": "self_attn", "mlp_out": "mlp"}[point]
  return {"transformers": f"forward hook on model.layers.{i}.{module} (output{'[0]' if point == 'attn_out' else ''})",
          "transformer_lens": f"blocks.{i}.hook_{point}"}


def _table(batch: dict[str, np.ndarray], keys: list[str]):
  import pyarrow as pa
  cols = {"prompt_id": pa.array(batch["row_ids"].astype(np.int64)),
          "position": pa.array(batch["positions"].astype(np.int32)),
          "token": pa.array(batch["tokens"].astype(np.int32))}
  for k in keys:
    x = np.ascontiguousarray(batch[k].astype(np.float32) if batch[k].dtype != np.float32 else batch[k])
    cols[k] = pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), x.shape[1])
  return pa.table(cols)


def export(url: str, out: str, to: str = "arrow", keys: list[str] | None = None,
           max_file_bytes: int = MAX_FILE_BYTES) -> dict:
  """Stream the (complete) dataset at `url` into Arrow files under `out`; returns what export.json holds."""
  from jaxpod.runtime.extras import require
  pa = require("pyarrow", "`jaxpod extract export`")
  if to not in FORMATS:
    raise ValueError(f"extract export --to {to!r} is not supported; use one of {'|'.join(FORMATS)}")
  ds = Dataset(url, strict=True)
  keys = ds._keys(keys)
  fs, root = fsspec.core.url_to_fs(out)
  if fs.exists(root) and fs.ls(root):
    raise ValueError(f"extract export --out {out!r} is not empty; choose a new folder")
  fs.makedirs(root, exist_ok=True)
  files, rows, sink, handle, schema = [], 0, None, None, None

  def close():
    if sink is not None:
      sink.close()
      handle.close()

  try:
    for batch in ds.iter_batches(keys=keys, drop_padding=True):
      table = _table(batch, keys)
      schema = schema or table.schema
      if sink is None or handle.tell() >= max_file_bytes:
        close()
        files.append(f"data-{len(files):05d}.arrow")
        handle = fs.open(f"{root.rstrip('/')}/{files[-1]}", "wb")
        sink = pa.ipc.new_stream(handle, schema)
      sink.write_table(table)
      rows += table.num_rows
  finally:
    close()
  num_layers = int(ds.info["model_config"]["num_hidden_layers"])
  record = {"format": "arrow-ipc-stream", "source": url, "run_id": ds.info["run_id"], "files": files,
            "rows": rows, "row": "token (padding dropped)", "columns": ["prompt_id", "position", "token", *keys],
            "dtype": "float32", "stored_dtype": ds.dtype, "hidden_size": ds.info["hidden_size"],
            "hf_names": {k: hf_names(k, num_layers) for k in keys}}
  storage.write_text(storage.join(out, "export.json"), json.dumps(record, indent=1))  # atomic: last, when complete
  return record
