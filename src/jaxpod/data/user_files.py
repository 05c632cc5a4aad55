"""Files users bring (prompt sets, preference pairs), read with HF `datasets`: one loader for both.

    table = load_table("gs://bucket/prefs.jsonl", builders=BUILDERS, label="pair file")   # a datasets.Dataset

The builder comes from the extension. A bucket file is copied once through `runtime.storage` (the
one storage layer) into a temporary folder and read from there, in memory, so no `datasets` cache is
left behind for a remote file. A missing file, an unknown extension or a file `datasets` cannot parse
is one line naming the file (`error` is the caller's exception type). `datasets` is an extra, named
when missing; its progress bars are off (one bar per read on every host's console otherwise).
"""
from __future__ import annotations

import tempfile
from typing import Mapping

from jaxpod.runtime import storage

BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".arrow": "arrow"}


def load_table(path: str, *, builders: Mapping[str, str] = BUILDERS, label: str = "file",
               error: type[ValueError] = ValueError):
  """The file at `path` (local or URL) as a `datasets.Dataset`; `error` naming the file if it cannot be read."""
  from jaxpod.runtime.extras import require
  suffix = next((s for s in builders if path.lower().endswith(s)), None)
  if suffix is None:
    raise error(f"{path}: unknown {label} type; use one of {', '.join(builders)}")
  datasets = require("datasets", f"reading the {label} {path}")
  datasets.disable_progress_bars()
  if not storage.exists(path):
    raise error(f"{path}: no such {label}; check the path (a URL needs its scheme, e.g. gs://)")
  try:
    if not storage.is_remote(path):
      return datasets.load_dataset(builders[suffix], data_files=storage.absolute(path), split="train")
    with tempfile.TemporaryDirectory() as tmp:
      local = f"{tmp}/table{suffix}"
      with open(local, "wb") as f:
        f.write(storage.read_bytes(path))
      return datasets.load_dataset(builders[suffix], data_files=local, split="train", cache_dir=f"{tmp}/cache",
                                   keep_in_memory=True)
  except Exception as e:  # noqa: BLE001 - datasets raises many types for a malformed file
    message = str(e).splitlines()[0] if str(e) else ""
    raise error(f"{path}: datasets could not read it ({type(e).__name__}: {message})") from None
