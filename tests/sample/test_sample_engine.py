"""The sampling engine on one process: HF parity, chunk/mode independence, sampling knobs, memory check."""
import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from jaxpod.models.llama import ByteTokenizer, hf_io
from jaxpod.runtime import MeshConfig, make_mesh
from jaxpod.sample import EngineConfig, SampleConfig, Sampler, SamplingParams, check_memory, run, sample_tokens

from sample_fixtures import EOS, PROMPTS, STOP

TOK = ByteTokenizer()


def _sampler(folder, devices=2, model_axis=1, batch=4, new=10, sp=SamplingParams(), mode="global"):
  mesh = make_mesh(data=-1, model=model_axis, devices=jax.devices()[:devices])
  ec = EngineConfig(batch_size=batch, max_prompt_len=32, max_new_tokens=new)
  return Sampler(hf_io.load(folder, mesh), mesh, ec, sp, [EOS, STOP], mode=mode)


@pytest.mark.slow
def test_greedy_matches_hf_generate_on_ragged_prompts(tiny_ckpt):
  """Right-padded batched prefill + shared-slot decode == HF generate of each prompt alone."""
  from transformers import LlamaForCausalLM
  hf = LlamaForCausalLM.from_pretrained(tiny_ckpt).eval()
  ids = [TOK.encode(p) for p in PROMPTS]
  got = _sampler(tiny_ckpt, devices=4, model_axis=2).generate(ids, [0] * len(ids))
  reasons = []
  for row, c in zip(ids, got):
    new, reason = c.tokens, c.finish_reason
    with torch.no_grad():
      out = hf.generate(torch.tensor([row]), max_new_tokens=10, do_sample=False, eos_token_id=[EOS, STOP],
                        pad_token_id=258, attention_mask=torch.ones(1, len(row), dtype=torch.long))
    want = out[0, len(row):].tolist()
    assert new + ([want[-1]] if reason == "stop" else []) == want
    reasons.append(reason)
  assert {"stop", "length"} <= set(reasons), reasons  # both finish paths are exercised


@pytest.mark.slow
def test_sampled_outputs_independent_of_chunking_and_mode(tiny_ckpt):
  """Per-request seeds: the same completion whatever the batch size, mesh or mode."""
  sp = SamplingParams(temperature=0.8, top_k=20, top_p=0.9)
  ids = [TOK.encode(p) for p in PROMPTS]
  seeds = list(range(100, 100 + len(ids)))
  a = _sampler(tiny_ckpt, devices=2, batch=2, sp=sp).generate(ids, seeds)
  b = _sampler(tiny_ckpt, devices=4, model_axis=2, batch=4, sp=sp, mode="replicated").generate(ids, seeds)
  assert [x.sampled for x in a] == [x.sampled for x in b]
  for x, y in zip(a, b):
    np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-5)
  c = _sampler(tiny_ckpt, devices=2, batch=2, sp=sp).generate(ids, [s + 1 for s in seeds])
  assert [x.sampled for x in a] != [x.sampled for x in c]  # seeds matter


def test_sample_tokens_knobs():
  logits = jax.random.normal(jax.random.key(0), (16, 50))
  keys = jax.vmap(jax.random.key)(jnp.arange(16))
  greedy = np.asarray(jnp.argmax(logits, -1))
  for sp in (SamplingParams(), SamplingParams(temperature=2.0, top_k=1), SamplingParams(temperature=2.0, top_p=1e-6)):
    np.testing.assert_array_equal(np.asarray(sample_tokens(logits, keys, sp)[0]), greedy)
  top5 = np.asarray(jax.lax.top_k(logits, 5)[1])
  got, logp = map(np.asarray, sample_tokens(logits, keys, SamplingParams(temperature=5.0, top_k=5)))
  assert all(g in row for g, row in zip(got, top5))
  assert (got != greedy).any()
  top = np.asarray(jax.lax.top_k(logits / 5.0, 5)[0])  # log-prob under the top-5 distribution it was drawn from
  want = [np.asarray(jax.nn.log_softmax(top[i]))[list(top5[i]).index(g)] for i, g in enumerate(got)]
  np.testing.assert_allclose(logp, want, atol=1e-6)


def test_memory_check_names_the_knob(tiny_ckpt):
  cfg = hf_io.load_config(tiny_ckpt)
  mesh = make_mesh(devices=jax.devices()[:1])
  ec = EngineConfig(batch_size=64, max_prompt_len=16, max_new_tokens=100_000)
  with pytest.raises(ValueError, match=r"exceeds .* the largest part is \w+: lower sample\.(batch_size|max_)"):
    check_memory(cfg, ec, mesh, available=2**30)
  plan = check_memory(cfg, dataclasses.replace(ec, max_new_tokens=16), mesh, available=2**30)
  assert plan["weights"] == cfg.num_params() * 4


def test_run_writes_jsonl_once(tiny_ckpt, tmp_path):
  prompts = tmp_path / "p.jsonl"
  prompts.write_text("".join(json.dumps({"prompt": p, **({"seed": 9} if i == 0 else {})}) + "\n"
                             for i, p in enumerate(PROMPTS)))
  cfg = SampleConfig(hf=tiny_ckpt, prompts=str(prompts), out=str(tmp_path / "o.jsonl"), max_new_tokens=6,
                     batch_size=8, max_prompt_len=32, mesh=MeshConfig(data=4, model=2), weight_version="v1")
  run(cfg)
  rows = [json.loads(l) for l in (tmp_path / "o.jsonl").read_text().splitlines()]
  assert [r["prompt"] for r in rows] == PROMPTS
  assert [r["seed"] for r in rows] == [9] + list(range(1, len(PROMPTS)))
  assert all(set(r) >= {"prompt", "completion", "token_ids", "finish_reason", "weight_version"} for r in rows)
  assert rows[0]["weight_version"] == "v1" and rows[0]["completion"] == TOK.decode(rows[0]["token_ids"])
  assert all(len(r["logprobs"]) == len(r["token_ids"]) + (r["finish_reason"] == "stop") for r in rows)
  with pytest.raises(ValueError, match="max_prompt_len=4"):
    run(dataclasses.replace(cfg, max_prompt_len=4))


@pytest.mark.slow
def test_cli_smoke(tiny_ckpt, tmp_path):
  """`jaxpod sample` end to end in a fresh process; a bad --mode fails with the field named."""
  import subprocess
  import sys
  (tmp_path / "p.txt").write_text("hello\nworld\n")
  base = [sys.executable, "-m", "jaxpod.cli.main", "sample", "--hf", tiny_ckpt, "--prompts",
          str(tmp_path / "p.txt"), "--out", str(tmp_path / "o.jsonl")]
  r = subprocess.run(base + ["--max-new-tokens", "3", "--batch-size", "8"], capture_output=True, text=True,
                     timeout=120)
  assert r.returncode == 0, r.stderr
  assert len((tmp_path / "o.jsonl").read_text().splitlines()) == 2
  r = subprocess.run(base + ["--mode", "pipeline"], capture_output=True, text=True, timeout=60)
  assert r.returncode == 2 and "sample.mode='pipeline'" in r.stderr, r.stderr
