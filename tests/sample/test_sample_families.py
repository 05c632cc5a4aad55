"""Every decoder family through both engines and both KV layouts (sliding windows included: the prompts and
completions reach past the window of 8): greedy tokens equal HF generate's, and the log-probs the engines return
equal a teacher-forced forward. For Qwen3 and Gemma 3 the slots layout runs as `jaxpod sample` does (`run`:
config.json through the family registry, the checkpoint loaded sharded over data 4 x model 2, JSONL out); the
other families skip that layout (its attention code is the one Gemma 3's sliding and full layers run through,
and each layout costs a compile). One engine run per family serves both tests."""
import json
from pathlib import Path

import jax
import numpy as np
import pytest
import torch

from jaxpod.models.llama import hf_io
from jaxpod.runtime import make_mesh
from jaxpod.runtime import MeshConfig
from jaxpod.sample import EngineConfig, SampleConfig, Sampler, SamplingParams, run
from tests.hf_families import FAMILIES, WINDOW

from sample_fixtures import EOS, IDS, PROMPTS, SEEDS, STOP, lockstep, same

NEW = 10
# every prompt in one prefill and one decode capacity: few programs to compile (requests joining mid-stream are
# test_sample_continuous.py's subject; here it is each family's attention in each KV layout)
ONE_ROUND = dict(batch_size=8, max_prompt_len=32, max_new_tokens=NEW, page_size=16, steps_per_round=NEW,
                 prefill_batch=8, min_prefill_len=32)
assert max(map(len, IDS)) + NEW > 2 * WINDOW
SAMPLE_RUN = ("qwen3", "gemma3_text")  # families that also run `jaxpod sample` (slots layout)


@pytest.fixture(scope="module")
def runs(hf_family, tmp_path_factory):
  """runs(family) -> (model, {"hf", "lockstep", "paged", "slots" (SAMPLE_RUN)}: completions of IDS), made once."""
  made = {}

  def get(family):
    if family not in made:
      folder, hf_model = hf_family(family)
      model = hf_io.load(folder, make_mesh(devices=jax.devices()[:1]))
      out = {"lockstep": lockstep(model, SamplingParams(), new=NEW),
             "paged": Sampler(model, make_mesh(devices=jax.devices()[:1]), EngineConfig(**ONE_ROUND, kv_layout="paged"),
                              SamplingParams(), [EOS, STOP]).generate(IDS, SEEDS),
             "hf": [_hf_greedy(hf_model, row) for row in IDS]}
      if family in SAMPLE_RUN:
        out["slots"] = _jaxpod_sample(folder, tmp_path_factory.mktemp(f"sample_{family}"))
      made[family] = model, out
    return made[family]
  return get


def _jaxpod_sample(folder, tmp):
  """`jaxpod sample` (slots layout) of PROMPTS (no tokenizer files: bytes, as IDS): its JSONL rows."""
  (tmp / "p.txt").write_text("".join(p + "\n" for p in PROMPTS))
  cfg = SampleConfig(hf=folder, prompts=str(tmp / "p.txt"), out=str(tmp / "o.jsonl"), max_new_tokens=NEW,
                     batch_size=8, max_prompt_len=32, stop_token_ids=(STOP,), kv_layout="slots",
                     mesh=MeshConfig(data=4, model=2))
  run(cfg)
  rows = [json.loads(l) for l in (tmp / "o.jsonl").read_text().splitlines()]
  assert [r["prompt"] for r in rows] == PROMPTS
  return rows


def _hf_greedy(hf_model, row):
  with torch.no_grad():
    out = hf_model.generate(torch.tensor([row]), max_new_tokens=NEW, do_sample=False, eos_token_id=[EOS, STOP],
                            pad_token_id=258, attention_mask=torch.ones(1, len(row), dtype=torch.long))
  return tuple(out[0, len(row):].tolist())


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_tokens_equal_hf_generate_in_every_engine(runs, family):
  """Token identity (fp32, greedy): HF generate of each prompt alone = lock-step engine = continuous engine
  (paged; slots through `jaxpod sample` for SAMPLE_RUN); sliding layers keep every key and mask those past the
  window."""
  _, out = runs(family)
  assert [c.sampled for c in out["lockstep"]] == out["hf"]
  same(out["paged"], out["lockstep"])
  for row, c in zip(out.get("slots", ()), out["lockstep"]):  # jaxpod sample's JSONL: tokens without the stop token
    assert (row["token_ids"], row["finish_reason"]) == (c.tokens, c.finish_reason)
    np.testing.assert_allclose(row["logprobs"], c.logprobs, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_engine_logprobs_equal_a_teacher_forced_forward(runs, family):
  """The log-probs of every engine are log softmax of one plain forward over prompt + sampled tokens."""
  model, out = runs(family)
  completions = out["lockstep"]
  rows = [IDS[c.request] + list(c.sampled) for c in completions]
  tokens = np.zeros((len(rows), 48), np.int32)  # causal: padding after a row does not change its logits
  for i, r in enumerate(rows):
    tokens[i, :len(r)] = r
  logp = np.asarray(jax.nn.log_softmax(jax.jit(lambda t: model(t).logits)(tokens), axis=-1))
  for engine in ("lockstep", "paged"):  # slots: jaxpod sample's log-probs equal the lock-step engine's (above)
    got = [lp for c in out[engine] for lp in c.logprobs]
    want = [logp[c.request, len(IDS[c.request]) - 1 + t, tok] for c in out[engine] for t, tok in enumerate(c.sampled)]
    assert np.max(np.abs(np.asarray(got) - np.asarray(want))) <= 1e-5, engine


def test_jaxpod_sample_renders_message_prompts_with_the_checkpoints_chat_template(hf_family, tmp_path):
  """Prompts given as message lists: `jaxpod sample` renders them with the checkpoint's own chat template (Gemma 3's,
  beside byte-level HF tokenizer files) to the ids transformers' apply_chat_template gives, and completes them as
  HF generate does; a text prompt in the same file stays text."""
  import shutil
  from transformers import AutoTokenizer
  from jaxpod.models.llama.tokenizer import save_byte_tokenizer
  folder, hf_model = hf_family("gemma3_text")
  ckpt = tmp_path / "ckpt"
  shutil.copytree(folder, ckpt)
  save_byte_tokenizer(str(ckpt))
  shutil.copy(Path(__file__).parents[1] / "data" / "chat_templates" / "gemma3.jinja", ckpt / "chat_template.jinja")
  chats = [[{"role": "user", "content": "What is 2+3?"}],
           [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]]
  lines = [json.dumps({"messages": m}) for m in chats] + [json.dumps({"prompt": "plain text"})]
  (tmp_path / "p.jsonl").write_text("\n".join(lines) + "\n")
  run(SampleConfig(hf=str(ckpt), prompts=str(tmp_path / "p.jsonl"), out=str(tmp_path / "o.jsonl"),
                   max_new_tokens=NEW, batch_size=8, max_prompt_len=96, mesh=MeshConfig(data=8)))
  rows = [json.loads(l) for l in (tmp_path / "o.jsonl").read_text().splitlines()]
  hf_tok = AutoTokenizer.from_pretrained(str(ckpt), local_files_only=True)
  prompt_ids = [hf_tok.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=False)
                for m in chats] + [hf_tok("plain text")["input_ids"]]
  assert rows[0]["prompt"] == hf_tok.apply_chat_template(chats[0], add_generation_prompt=True, tokenize=False)
  assert rows[2]["prompt"] == "plain text" and prompt_ids[0][0] == prompt_ids[2][0] == 256  # one BOS each
  for row, ids in zip(rows, prompt_ids):
    with torch.no_grad():
      out = hf_model.generate(torch.tensor([ids]), max_new_tokens=NEW, do_sample=False, eos_token_id=EOS,
                              pad_token_id=258, attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    want = out[0, len(ids):].tolist()
    assert row["token_ids"] == (want[:-1] if row["finish_reason"] == "stop" else want)
