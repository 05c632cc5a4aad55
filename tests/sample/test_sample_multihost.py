"""Multi-host sampling through jaxpod's launcher; one launch per host count serves several tests."""
import io
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from jaxpod.runtime import MeshConfig
from jaxpod.runtime.launcher import LaunchConfig, launch
from jaxpod.sample import SampleConfig, run

from sample_fixtures import PROMPTS

WORKER = Path(__file__).parent / "workers" / "sample_worker.py"
pytestmark = [pytest.mark.multihost, pytest.mark.slow]
SAMPLING = dict(batch_size=4, max_prompt_len=32, max_new_tokens=8, temperature=0.8, top_k=20, top_p=0.9, seed=11,
                n=2, page_size=4)


def _launch(folder, hosts, devices_per_host, scenarios, ckpt, timeout_s=300, family_ckpt=None):
  bad = folder / "bad_ckpt"
  shutil.copytree(ckpt, bad)
  (bad / "tokenizer.json").write_text("{broken")
  prompts = folder / "p.txt"
  prompts.write_text("\n".join(PROMPTS * 2))  # 14 prompts, 2 samples each, through 4 slots
  env = dict(os.environ)
  env.pop("JAX_NUM_CPU_DEVICES", None)
  log = io.StringIO()
  result = launch([sys.executable, str(WORKER), scenarios, ckpt, str(prompts), str(folder), str(bad),
                   *([family_ckpt] if family_ckpt else [])],
                  LaunchConfig(hosts=hosts, devices_per_host=devices_per_host, log_dir=str(folder / "logs"),
                               timeout_s=timeout_s), sink=log, summary=log, env=env)
  result.transcript = log.getvalue()
  return result, prompts


FAMILY = "gemma3_text"  # sliding (window 8) and full layers, each with its own RoPE base


@pytest.fixture(scope="module")
def two_hosts(tiny_ckpt, hf_family, tmp_path_factory):
  folder = tmp_path_factory.mktemp("two_hosts")
  result, prompts = _launch(folder, 2, 2, "modes,fail,hook,family", tiny_ckpt, family_ckpt=hf_family(FAMILY)[0])
  return result, folder, prompts


def _lines(result, host, tag):
  return [l[len(tag):].strip() for l in result.output[host] if l.startswith(tag)]


def _records(path):
  return [{k: r[k] for k in ("prompt", "sample", "token_ids", "finish_reason", "seed")}
          for r in map(json.loads, Path(path).read_text().splitlines())]


def _reference(ckpt, prompts, folder):
  ref = folder / "ref.jsonl"
  run(SampleConfig(hf=ckpt, prompts=str(prompts), out=str(ref), mesh=MeshConfig(data=4, model=2), **SAMPLING))
  return _records(ref)


def test_two_hosts_both_modes_match_one_host(two_hosts, tiny_ckpt):
  """Invariant 1: sizes and prompts come from the leader, so 1 host and 2 hosts (global over a
  data=2 x model=2 mesh, and replicated) give identical completions, 2 per prompt, through the
  continuous engine (global: the schedule digest agrees on both hosts); invariant 4: the leader writes."""
  r, folder, prompts = two_hosts
  assert r.returncode == 0, r.transcript
  assert all(_lines(r, h, "DONE modes") for h in range(2))
  want = _reference(tiny_ckpt, prompts, folder)
  assert len(want) == 28 and [w["sample"] for w in want[:4]] == [0, 1, 0, 1]
  for mode in ("global", "replicated"):
    assert _records(folder / f"{mode}.jsonl") == want, mode


def test_sliding_window_family_on_two_hosts_gives_hf_generate_tokens(two_hosts, hf_family):
  """A Gemma 3 checkpoint sampled greedily by 2 hosts x 2 devices (data=2 x model=2, continuous engine, slots):
  every completion (prompt + new tokens past the window of 8) equals HF generate's for that prompt alone."""
  import torch
  from sample_fixtures import EOS
  r, folder, _ = two_hosts
  assert all(_lines(r, h, "DONE family") for h in range(2)), r.transcript
  _, hf_model = hf_family(FAMILY)
  rows = [json.loads(l) for l in (folder / "family.jsonl").read_text().splitlines()]
  assert len(rows) == 14
  for row in rows[:7]:  # the file repeats PROMPTS twice; the repeats are asserted equal below
    ids = [256] + list(row["prompt"].encode())
    with torch.no_grad():
      out = hf_model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False, eos_token_id=EOS,
                              pad_token_id=258, attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    want = out[0, len(ids):].tolist()
    assert row["token_ids"] == (want[:-1] if row["finish_reason"] == "stop" else want), row["prompt"]
  assert [r_["token_ids"] for r_ in rows[:7]] == [r_["token_ids"] for r_ in rows[7:]]


def test_leader_tokenizer_error_and_oversized_config_fail_on_every_host(two_hosts):
  """Invariants 3 and 7: the leader's tokenizer error and the memory check reach every host
  (as the error itself on the leader, PeerFailed elsewhere) before anything compiles; no hang.
  Invariant 8: each host tokenizes the prompt file itself (ids do not ride the control plane), so a
  file that differs on host 1 is named on every host."""
  r, _, _ = two_hosts
  for h in range(2):
    got = {l.split(" ", 1)[0]: json.loads(l.split(" ", 1)[1]) for l in _lines(r, h, "FAIL")}
    assert set(got) == {"tokenizer", "memory", "prompts"}, r.transcript
    assert got["tokenizer"]["type"] == ("ValueError" if h == 0 else "PeerFailed")
    assert "tokenizer.json cannot be read" in got["tokenizer"]["message"]
    assert got["memory"]["type"] == ("ValueError" if h == 0 else "PeerFailed")
    assert "the largest part is kv_cache: lower sample.batch_size=4096" in got["memory"]["message"]
    assert got["prompts"]["type"] == "ValueError", got["prompts"]  # every host names host 1
    assert got["prompts"]["message"].startswith("host 1: sample.prompts=") and "differ from the leader's 1" in \
        got["prompts"]["message"]


def test_sample_hook_leaves_training_bit_identical(two_hosts):
  """Invariant 6: the loss sequence with SampleHook every 2 steps (global and replicated mode)
  equals the one without, bit for bit, on 2 hosts; both modes sample the same tokens;
  invariant 4: only the leader writes the samples."""
  r, folder, _ = two_hosts
  for h in range(2):
    losses = dict(l.split(" ", 1) for l in _lines(r, h, "LOSSES"))
    assert set(losses) == {"plain", "hook", "hook_replicated"}, r.transcript
    assert losses["plain"] == losses["hook"] == losses["hook_replicated"]
  rows = {name: [json.loads(l) for l in (folder / f"{name}.jsonl").read_text().splitlines()]
          for name in ("hook", "hook_replicated")}
  assert [row["step"] for row in rows["hook"]] == [2] * 4 + [4] * 4 + [6] * 4
  assert rows["hook"][-1]["weight_version"] == "step 6"
  assert [x["token_ids"] for x in rows["hook"]] == [x["token_ids"] for x in rows["hook_replicated"]]

