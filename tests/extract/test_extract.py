"""Extraction end to end: values vs transformers, byte-identical across hosts and meshes, resume.

DESIGN.md invariants: 1 (prompts decided on the leader, same forward everywhere), 3 (a failure
names its host), 4 (replica-0 shards placed by global index), 5 (global resume).
"""
import json
from pathlib import Path

import numpy as np
import pytest

from jaxpod import extract
from jaxpod.runtime import storage
from tests.conftest import host_lines
from jaxpod.extract.sharded import TOLERANCE
from tests.extract.conftest import (BASE_OPTIONS, BUDGET, PROMPTS, assert_close_dataset, assert_same_dataset,
                                    hf_captures)

WORKER = Path(__file__).parent / "workers" / "extract_worker.py"
TOL = 1e-5  # fp32 vs torch fp32: a few ulps measured (see tests/models/llama/test_llama_parity.py)


def test_values_equal_transformers_hidden_states(baseline, tiny_ckpt):
  """resid.i == hidden_states[i+1]; the last block's resid is before the final norm (HF's last entry is after)."""
  _, hf_model, _ = tiny_ckpt
  n_layers = hf_model.config.num_hidden_layers
  for row, batch in enumerate(baseline.iter_batches(batch_size=1)):
    m = batch["mask"][0]
    ids = batch["tokens"][0][m].tolist()
    hooks, hs = hf_captures(hf_model, ids)
    for i in baseline.layers:
      ours = batch[f"resid.{i}"][0][m]
      if i + 1 < n_layers:
        np.testing.assert_allclose(ours, hs[i + 1], atol=TOL)
      else:  # HF's hidden_states[L] has the final norm applied; the residual itself is the block output
        assert np.abs(ours - hs[i + 1]).max() > 1e-2
      np.testing.assert_allclose(ours, hooks[f"resid.{i}"], atol=TOL)
      for p in ("attn_out", "mlp_out"):
        np.testing.assert_allclose(batch[f"{p}.{i}"][0][m], hooks[f"{p}.{i}"], atol=TOL)
  assert row == len(PROMPTS) - 1


def test_reader_batches_padding_and_order(baseline):
  """Sample order across any batch size; drop_padding keeps exactly the real tokens."""
  full = baseline["resid.2"]
  mask = baseline.mask
  assert full.shape == (len(PROMPTS), baseline.seq_len, 64) and baseline.completeness.ok
  chunks = list(baseline.iter_batches(batch_size=5, keys=["resid.2"]))
  assert [len(c["row_ids"]) for c in chunks] == [5, 5, 5, 5, 1]
  assert np.concatenate([c["row_ids"] for c in chunks]).tolist() == list(range(len(PROMPTS)))
  assert np.concatenate([c["resid.2"] for c in chunks]).tobytes() == full.tobytes()
  flat = baseline.array("resid.2", drop_padding=True)
  np.testing.assert_array_equal(flat, full[mask])
  b = next(baseline.iter_batches(batch_size=3, drop_padding=True))
  assert (b["row_ids"] < 3).all() and len(b["tokens"]) == mask[:3].sum() == len(b["resid.0"])
  np.testing.assert_array_equal(b["positions"], np.nonzero(mask[:3])[1])
  assert mask.sum(1).tolist() == [min(len(p.encode()) + 1, 48) for p in PROMPTS]  # BOS + bytes, truncated


def test_bf16_is_f32_rounded(baseline, tiny_ckpt):
  """--dtype bf16 stores bfloat16 (a uint16 view on disk) equal to the f32 values rounded."""
  import ml_dtypes
  model, _, prompts = tiny_ckpt
  cfg = extract.ExtractConfig(hf=model, prompts=prompts, out="memory://extract-tests/bf16", batch_size=8,
                              layers=(2,), points=("resid",), max_seq_len=48, dtype="bf16", progress=False,
                              forward="exact")
  extract.run(cfg)
  ds = extract.open(cfg.out)
  got = ds["resid.2"]
  assert got.dtype == ml_dtypes.bfloat16
  assert got.tobytes() == baseline["resid.2"].astype(ml_dtypes.bfloat16).tobytes()


def test_completeness_names_missing_and_duplicated_rows(baseline):
  """A lost shard file -> rows missing; a stray copy -> rows duplicated; both named by row id."""
  fs = baseline.storage.fs
  root = "memory://extract-tests/damaged"
  fs.copy(baseline.storage.root, "/extract-tests/damaged", recursive=True)
  fs.rm("/extract-tests/damaged/shards/b000001-h0000.safetensors")
  with pytest.raises(extract.IncompleteDataset, match=r"8 of 21 rows missing \(8-15\)"):
    extract.open(root)
  fs.copy("/extract-tests/damaged/shards/b000002-h0000.safetensors",
          "/extract-tests/damaged/shards/b000002-h0007.safetensors")
  c = extract.open(root, strict=False).completeness
  assert c.missing.tolist() == list(range(8, 16)) and c.duplicated.tolist() == [16, 17, 18, 19, 20]
  assert "rows more than once (16-20)" in c.describe()


@pytest.mark.slow
@pytest.mark.multihost
@pytest.mark.parametrize("hosts,mesh,batch", [
    (2, (2, 1, 2), 8),  # model=2: rows over all 4 devices
    (4, (1, 2, 4), 6),  # fsdp=2, model=4 spanning hosts: rows replicated over model, replica 0 only
])
def test_multi_host_datasets_are_byte_identical(baseline, tiny_ckpt, launch_hosts, bucket, hosts, mesh, batch):
  """Invariants 1, 4, 8: any hosts x mesh, isolated hosts writing to a bucket, gives the same bytes as one
  process."""
  model, _, prompts = tiny_ckpt
  out = storage.join(bucket, "acts")
  r = launch_hosts(WORKER, hosts=hosts, devices_per_host=2, args=[model, prompts, out, *mesh, batch, "exact", 0])
  assert r.returncode == 0, r.transcript
  assert_same_dataset(extract.open(out), baseline)
  manifest = json.loads(storage.read_text(storage.join(out, "manifest.json")))
  assert manifest["hosts"] == hosts and manifest["mesh"] == dict(zip(("data", "fsdp", "model"), mesh))
  assert manifest["counts"]["rows"] == len(PROMPTS)
  if mesh[2] == 4:  # model group = hosts {0,1} and {2,3}: only hosts 0 and 2 hold replica 0
    writers = {int(name.split("-h")[1][:4]) for name in storage.listdir(storage.join(out, "shards"))}
    assert writers == {0, 2}


def _shard_bytes(out: str) -> dict[str, bytes]:
  folder = storage.join(out, "shards")
  return {name: storage.read_bytes(storage.join(folder, name)) for name in storage.listdir(folder)}


@pytest.mark.slow
@pytest.mark.multihost
def test_killed_host_then_rerun_gives_the_uninterrupted_dataset(baseline, tiny_ckpt, launch_hosts, bucket):
  """Invariants 5, 8 on the sharded forward, 2 hosts x 2 devices (fsdp=2 across hosts, model=2), under a
  per-device budget the whole weights exceed: host 1 dies after batch 2; a host that lost its last commits
  makes everyone resume from the minimum; re-written shards are byte-identical to the first write; no row
  missing or duplicated; values equal the exact path (= HF) within the sharded tolerance."""
  model, _, prompts = tiny_ckpt
  out = storage.join(bucket, "acts")
  args = [model, prompts, out, 1, 2, 2, 2, "sharded", BUDGET]
  r = launch_hosts(WORKER, hosts=2, devices_per_host=2, args=[*args, "exit", 1, 2], grace_s=2)
  assert r.returncode == 3 and r.first_failed == 1, r.transcript
  with pytest.raises(extract.IncompleteDataset, match="rows missing"):
    extract.open(out)
  partial = extract.open(out, strict=False)
  assert partial.completeness.missing.min() >= 6 and not len(partial.completeness.duplicated)
  before = _shard_bytes(out)
  record = storage.join(out, "progress", "h0000.json")
  rec = json.loads(storage.read_text(record))
  assert rec["next_batch"] >= 3
  storage.write_text(record, json.dumps(dict(rec, next_batch=1)))  # host 0 lost its commits of batches 1..

  r = launch_hosts(WORKER, hosts=2, devices_per_host=2, args=args)
  assert r.returncode == 0, r.transcript
  for h in (0, 1):
    assert json.loads(host_lines(r, h, "STATS")[0])["start_batch"] == 1
  ds = extract.open(out)
  assert json.loads(storage.read_text(storage.join(out, "manifest.json")))["forward"] == "sharded"
  assert_close_dataset(ds, baseline, TOLERANCE["float32"])
  after = _shard_bytes(out)
  assert all(after[n] == b for n, b in before.items()), "a re-written shard differs from the first write"
  assert len(after) == 2 * 11 - 1  # 21 rows / 2 = 11 batches; the last one (row 20) lives on host 0 only


@pytest.mark.multihost
def test_failure_on_one_host_is_named_everywhere(tiny_ckpt, launch_hosts, bucket):
  """Invariant 3: host 1 raises after batch 0; host 0 raises PeerFailed naming host 1; what was committed reads."""
  model, _, prompts = tiny_ckpt
  out = storage.join(bucket, "acts")
  args = [model, prompts, out, 2, 1, 1, 4, "sharded", 0, "raise", 1, 0]
  r = launch_hosts(WORKER, hosts=2, devices_per_host=1, args=args)
  assert r.returncode != 0
  info = json.loads(host_lines(r, 0, "PEERFAILED")[0])
  assert info == {"host": 1, "type": "RuntimeError", "message": "disk full at batch 0"}, r.transcript
  partial = extract.open(out, strict=False)
  missing = set(partial.completeness.missing.tolist())
  assert not partial.completeness.ok and not {2, 3} & missing  # host 1 committed its rows of batch 0


def test_info_cli_reports_completeness(baseline, capsys):
  """`jaxpod extract info URL`: summary of the dataset; exit 1 when rows are missing."""
  from jaxpod.cli.main import main
  assert main(["extract", "info", baseline.url, "--json", "true"]) == 0
  summary = json.loads(capsys.readouterr().out)
  assert summary["completeness"] == "complete: all 21 rows exactly once" and summary["rows"] == len(PROMPTS)
  assert summary["shapes"]["resid.2"] == [len(PROMPTS), baseline.seq_len, 64] and summary["hosts"] == 1
  assert summary["forward"] == "exact"
  fs = baseline.storage.fs
  fs.copy(baseline.storage.root, "/extract-tests/info", recursive=True)
  fs.rm("/extract-tests/info/shards/b000000-h0000.safetensors")
  assert main(["extract", "info", "memory://extract-tests/info"]) == 1
  assert "rows missing" in capsys.readouterr().out


def test_cli_extract_smoke(baseline, tiny_ckpt, capsys):
  """`jaxpod extract --layers 2 --points resid --forward exact ...` in one process gives the baseline's bytes."""
  from jaxpod.cli.main import main
  model, _, prompts = tiny_ckpt
  out = "memory://extract-tests/cli"
  code = main(["extract", "--hf", model, "--prompts", prompts, "--layers", "2", "--points", "resid", "--out", out,
               "--batch-size", "4", "--mesh.data", "4", "--mesh.model", "2", "--max-seq-len", "48",
               "--progress", "false", "--forward", "exact"])
  assert code == 0 and f"{len(PROMPTS)} samples" in capsys.readouterr().out
  ds = extract.open(out)
  assert ds.keys == ("resid.2",) and ds["resid.2"].tobytes() == baseline["resid.2"].tobytes()


def test_rerun_with_other_options_on_the_same_out_is_refused(baseline, tiny_ckpt):
  """Resume only continues the same extraction: other options on a used --out fail naming the fields."""
  model, _, prompts = tiny_ckpt
  options = dict(BASE_OPTIONS, layers=(1, 2), forward="exact")
  cfg = extract.ExtractConfig(hf=model, prompts=prompts, out=baseline.url, batch_size=8, **options)
  with pytest.raises(ValueError, match=r"holds another extraction \(differs in layers\)"):
    extract.run(cfg)
