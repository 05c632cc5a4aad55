"""Invariant 10 for data: the leader writes the causal-LM corpus and the preference pairs once, as row stores
(`jaxpod.io.rows`: chunk files with a sha256 each); every host reads only the rows of its share of each batch,
by byte range, checks them against their chunk's hash, and sees exactly the rows a single process would give it."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from jaxpod.io.rows import MANIFEST, ArrayRows, RowStore, write_rows
from jaxpod.runtime import storage

WORKER = Path(__file__).parent / "workers" / "rows_worker.py"


def _worker():
  spec = importlib.util.spec_from_file_location("rows_worker", WORKER)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _store(tmp_path, rows=103, chunk_rows=10):
  rng = np.random.default_rng(0)
  fields = {"tokens": rng.integers(0, 500, (rows, 2, 7)).astype(np.uint16),
            "answer": rng.integers(0, 2, (rows, 2, 7)).astype(np.int8)}
  url = str(tmp_path / "store")
  return url, fields, write_rows(url, fields, chunk_rows)


def test_a_row_store_fetches_only_the_rows_asked_for(tmp_path):
  """Rows come back in the order asked (repeats too); the bytes fetched are the manifest, the digest block of each
  chunk touched (once) and the rows themselves, nothing else."""
  url, fields, sha = _store(tmp_path)
  store = RowStore(url, sha)
  manifest = Path(url, MANIFEST).stat().st_size
  assert store.bytes_read == manifest
  asked = [57, 3, 4, 5, 3, 102, 58]
  got = store.read(asked)
  for name, array in fields.items():
    np.testing.assert_array_equal(got[name], array[asked])
  record = 2 * 7 * 2 + 2 * 7  # uint16 tokens + int8 answer
  assert store.bytes_read == manifest + 8 * (10 + 10 + 3) + 6 * record  # chunks 0, 5, 10: 10 + 10 + 3 digests
  store.read([4, 59])  # chunk 0 and 5's digests are already checked: rows only
  assert store.bytes_read == manifest + 8 * 23 + 8 * record
  whole = RowStore(url).read_all()
  for name, array in fields.items():
    np.testing.assert_array_equal(whole[name], array)
  np.testing.assert_array_equal(ArrayRows(fields).read(asked)["tokens"], got["tokens"])


def test_a_damaged_chunk_or_a_rewritten_manifest_is_named_in_one_line_with_the_fix(tmp_path):
  url, fields, sha = _store(tmp_path)
  chunk = Path(url, "chunk-00001.npy")
  raw = bytearray(chunk.read_bytes())
  raw[-1] ^= 1  # the last row of chunk 1: row 19
  chunk.write_bytes(bytes(raw))
  store = RowStore(url, sha)
  store.read([10, 18, 25])  # rows of chunk 1 that are intact still read
  with pytest.raises(ValueError) as e:
    store.read([19])
  message = str(e.value)
  assert "\n" not in message and f"{chunk} (chunk 1): rows 19..19 differ from what the leader wrote" in message
  assert f"delete {url} and rerun" in message
  with pytest.raises(ValueError, match=r"manifest.json changed since the leader wrote it .*task.data.cache_dir"):
    RowStore(url, "0" * 64)
  Path(url, "chunk-00002.npy").unlink()
  with pytest.raises(ValueError, match=r"chunk-00002.npy \(chunk 2\): rows 25..25 could not be read whole "
                                       r"\(FileNotFoundError.*delete .* and rerun"):
    store.read([25])


def test_documents_are_tokenized_in_batches_as_line_by_line(tmp_path):
  """encode_batch (a BPE's tokenizer.json) and the byte tokenizer's numpy path give the ids `encode` gives per line,
  BOS from the tokenizer and EOS after each non-empty line; packed_rows cuts the stream as one array would."""
  from jaxpod.data.text import grammar_text, packed_rows, token_batches, train_bpe_tokenizer
  from jaxpod.models.llama import ByteTokenizer, load_tokenizer
  lines = grammar_text(1, 3000).splitlines() + ["", "  ", "ünïcode ✓"]
  for tok in (ByteTokenizer(), load_tokenizer(train_bpe_tokenizer(grammar_text(0, 5000), 300, str(tmp_path / "t")))):
    expected = [i for l in lines if l.strip() for i in tok.encode(l) + [tok.eos_ids[0]]]
    batches = list(token_batches(lines, tok, tok.eos_ids[0], batch_lines=7))
    assert len(batches) > 2 and all(b.dtype == np.int32 for b in batches)
    assert np.concatenate(batches).tolist() == expected
    rows = np.concatenate(list(packed_rows(batches, 16)))
    np.testing.assert_array_equal(rows, np.asarray(expected[:len(expected) // 16 * 16]).reshape(-1, 16))


def _common(runs: str) -> list[str]:
  return ["--trainer.runs_dir", runs, "--trainer.progress", "false", "--trainer.plot", "false",
          "--tracker.tensorboard", "false"]


def _lm_args(runs: str) -> list[str]:
  return ["--task.type", "causal_lm", "--task.data.text_chars", "60000", "--task.data.seq_len", "64",
          "--task.data.global_batch_size", "8", "--task.data.eval_batch_size", "16", "--task.data.chunk_rows", "64",
          "--task.data.seed", "3", *_common(runs)]


def _pref_args(runs: str, pairs: str) -> list[str]:
  return ["--task.type", "preference", "--task.data.path", pairs, "--task.data.tokenizer", "byte",
          "--task.data.global_batch_size", "8", "--task.data.eval_batch_size", "6", "--task.data.eval_pairs", "20",
          "--task.data.max_prompt_length", "12", "--task.data.max_length", "20", *_common(runs)]


@pytest.mark.slow
@pytest.mark.multihost
def test_each_host_reads_only_its_rows_of_the_corpus_and_the_pairs(launch_hosts, bucket):
  """Invariant 10 (and 2, 8): 2 isolated hosts sharing a bucket. The leader tokenizes the corpus and the pair file
  into row stores; over one epoch of train batches and one eval pass each host fetches <= 1.5x (store / hosts)
  bytes (counted at the client: manifest, digests and rows), and its rows are exactly those a single process
  reading the whole array (and, for the corpus, today's in-memory token stream) gives that host."""
  pytest.importorskip("datasets")
  from jaxpod.cli.train import load_config
  from jaxpod.data.pairs import PairLoader
  from jaxpod.data.text import TextLoader
  from jaxpod.train.task import make_task
  from tests.conftest import host_lines
  from tests.tasks.conftest import sort_rows
  pairs = storage.join(bucket, "pairs.jsonl")
  storage.write_text(pairs, "".join(json.dumps(r) + "\n" for r in sort_rows(128)))
  runs = storage.join(bucket, "runs")
  lm, pref = _lm_args(runs), _pref_args(runs, pairs)
  r = launch_hosts(WORKER, hosts=2, devices_per_host=1, args=[json.dumps(lm), json.dumps(pref)], timeout_s=300)
  assert r.returncode == 0, r.transcript
  seen = [json.loads(host_lines(r, h, "SEEN")[0]) for h in range(2)]
  worker = _worker()
  lm_cfg, pref_cfg = load_config(lm), load_config(pref)
  stream = make_task(lm_cfg).tokenize()  # today's path: the whole corpus in one process
  for name, cfg in (("lm", lm_cfg), ("pref", pref_cfg)):
    url = seen[0][name]["url"]
    whole = RowStore(url)
    data_bytes = whole.num_rows * whole.dtype.itemsize
    arrays = whole.read_all()
    d = cfg.task.data
    for h in range(2):
      assert seen[h][name]["bytes"] <= 1.5 * data_bytes / 2, (name, h, seen[h][name]["bytes"], data_bytes)
      if name == "lm":
        for rows in (ArrayRows(arrays), stream):
          loader = TextLoader(rows, d.seq_len, d.global_batch_size, d.eval_batch_size, eval_fraction=d.eval_fraction,
                              seed=d.seed, shard_index=h, shard_count=2, pad_id=258)
          assert worker.seen(loader, loader.eval_iter()) == seen[h][name]["digest"], (name, h)
      else:
        loader = PairLoader(arrays, d.global_batch_size, min(d.eval_pairs, whole.num_rows // 4), seed=d.seed,
                            shard_index=h, shard_count=2)
        assert worker.seen(loader, loader.eval_iter(d.eval_batch_size)) == seen[h][name]["digest"], (name, h)
  assert len(RowStore(seen[0]["lm"]["url"]).manifest["chunks"]) > 10  # hosts read across many chunks
