"""`jaxpod extract export URL --out DIR`: Arrow files that HF `datasets` loads, equal to `jaxpod.extract.open`."""
import json

import ml_dtypes
import numpy as np
import pytest

from jaxpod import extract
from jaxpod.extract.export import export, hf_names


def test_export_loads_with_datasets_and_equals_reader(baseline, tmp_path, capsys):
  """One row per real token: prompt_id, position, token and one column per key, in sample order; small files."""
  import datasets
  from jaxpod.cli.main import main
  out = tmp_path / "arrow"
  assert main(["extract", "export", baseline.url, "--out", str(out)]) == 0
  assert "token rows" in capsys.readouterr().out
  record = json.loads((out / "export.json").read_text())
  got = datasets.load_dataset("arrow", data_files=[str(out / f) for f in record["files"]], split="train",
                              cache_dir=str(tmp_path / "hf_cache")).with_format("numpy")
  cols = got[:]  # every column as numpy
  flat = next(baseline.iter_batches(batch_size=baseline.num_rows, drop_padding=True))
  assert got.column_names == ["prompt_id", "position", "token", *baseline.keys] == record["columns"]
  assert len(got) == record["rows"] == int(baseline.mask.sum())
  np.testing.assert_array_equal(cols["prompt_id"], flat["row_ids"])
  np.testing.assert_array_equal(cols["position"], flat["positions"])
  np.testing.assert_array_equal(cols["token"], flat["tokens"])
  for k in baseline.keys:
    assert cols[k].dtype == np.float32 and cols[k].tobytes() == flat[k].tobytes(), k
  assert record["hf_names"]["resid.0"]["transformer_lens"] == "blocks.0.hook_resid_post"
  assert record["hf_names"]["resid.0"]["transformers"].startswith("output_hidden_states=True: hidden_states[1];")
  one = datasets.Dataset.from_file(str(out / record["files"][0]))  # memory-mapped, no cache copy
  assert one.num_rows == len(got)

  small = export(baseline.url, "memory://extract-tests/export-small", keys=["resid.2"], max_file_bytes=1)
  assert len(small["files"]) == baseline.info["num_batches"] and small["columns"][-1] == "resid.2"
  with pytest.raises(ValueError, match="is not empty; choose a new folder"):
    export(baseline.url, str(out))
  with pytest.raises(ValueError, match="--to 'parquet' is not supported; use one of arrow"):
    export(baseline.url, str(tmp_path / "other"), to="parquet")


def test_bf16_export_is_widened_exactly(tiny_ckpt, tmp_path):
  """bfloat16 activations come out float32, each value exactly the stored bfloat16 one."""
  import pyarrow as pa
  model, _, prompts = tiny_ckpt
  url = "memory://extract-tests/export-bf16"
  extract.run(extract.ExtractConfig(hf=model, prompts=prompts, out=url, batch_size=8, layers=(1,),
                                    max_seq_len=48, dtype="bf16", progress=False))
  record = export(url, str(tmp_path / "arrow"))
  with pa.ipc.open_stream(str(tmp_path / "arrow" / record["files"][0])) as r:
    table = r.read_all()
  stored = extract.open(url).array("resid.1", drop_padding=True)
  assert stored.dtype == ml_dtypes.bfloat16 and record["stored_dtype"] == "bfloat16"
  col = np.asarray(table.column("resid.1").combine_chunks().flatten()).reshape(stored.shape)
  np.testing.assert_array_equal(col, stored.astype(np.float32))


def test_hf_names_of_the_last_block_warn_about_the_final_norm():
  assert "before the final norm" in hf_names("resid.2", 3)["transformers"]
  assert hf_names("mlp_out.1", 3) == {"transformers": "forward hook on model.layers.1.mlp (output)",
                                      "transformer_lens": "blocks.1.hook_mlp_out"}
