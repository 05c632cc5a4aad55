"""Multi-host sampling through jaxpod's launcher (2 simulated hosts x 2 CPU devices)."""
import json
import shutil
from pathlib import Path

import pytest

from jaxpod.runtime import MeshConfig
from jaxpod.sample import SampleConfig, run

from conftest import PROMPTS

WORKER = Path(__file__).parent / "workers" / "sample_worker.py"
pytestmark = [pytest.mark.multihost, pytest.mark.slow]


def _lines(result, host, tag):
  return [l[len(tag):].strip() for l in result.output[host] if l.startswith(tag)]


def _records(path):
  return [{k: r[k] for k in ("prompt", "token_ids", "finish_reason", "seed")}
          for r in map(json.loads, Path(path).read_text().splitlines())]


def test_two_hosts_both_modes_match_one_host(launch_hosts, tiny_ckpt, tmp_path):
  """Invariant 1: sizes and prompts come from the leader, so 1 host and 2 hosts (global and
  replicated) produce identical completions; invariant 4: only the leader writes them."""
  prompts = tmp_path / "p.txt"
  prompts.write_text("\n".join(PROMPTS * 2))  # 14 prompts: 4 chunks of 4, the last one padded
  ref = tmp_path / "ref.jsonl"
  run(SampleConfig(model=tiny_ckpt, prompts=str(prompts), out=str(ref), batch_size=4, max_prompt_len=32,
                   max_new_tokens=8, temperature=0.8, top_k=20, top_p=0.9, seed=11, mesh=MeshConfig(data=4, model=2)))
  r = launch_hosts(WORKER, hosts=2, devices_per_host=2, args=["modes", tiny_ckpt, prompts, tmp_path], timeout_s=240)
  assert r.returncode == 0, r.transcript
  assert all(_lines(r, h, "DONE") for h in range(2))
  want = _records(ref)
  assert len(want) == 14
  for mode in ("global", "replicated"):
    assert _records(tmp_path / f"{mode}.jsonl") == want, mode


def test_leader_tokenizer_error_and_oversized_config_fail_on_every_host(launch_hosts, tiny_ckpt, tmp_path):
  """Invariants 3 and 7: the leader's tokenizer error and the memory check reach every host
  (as the error itself on the leader, PeerFailed elsewhere) before anything compiles; no hang."""
  bad = tmp_path / "bad_ckpt"
  shutil.copytree(tiny_ckpt, bad)
  (bad / "tokenizer.json").write_text("{broken")
  prompts = tmp_path / "p.txt"
  prompts.write_text("\n".join(PROMPTS))
  r = launch_hosts(WORKER, hosts=2, devices_per_host=2, args=["fail", tiny_ckpt, prompts, tmp_path, bad],
                   timeout_s=180)
  assert r.returncode == 0, r.transcript
  for h in range(2):
    got = {l.split(" ", 1)[0]: json.loads(l.split(" ", 1)[1]) for l in _lines(r, h, "FAIL")}
    assert set(got) == {"tokenizer", "memory"}, r.transcript
    assert got["tokenizer"]["type"] == ("ValueError" if h == 0 else "PeerFailed")
    assert "tokenizer.json cannot be read" in got["tokenizer"]["message"]
    assert got["memory"]["type"] == ("ValueError" if h == 0 else "PeerFailed")
    assert "sample memory check" in got["memory"]["message"]
    assert "the largest part is kv_cache: lower sample.batch_size=4096" in got["memory"]["message"]
