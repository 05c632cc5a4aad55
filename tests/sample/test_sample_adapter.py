"""`jaxpod sample --adapter PATH`: a PEFT LoRA adapter on the checkpoint, applied by the engine (unmerged)."""
import dataclasses
import json

import jax
import numpy as np
import pytest

from jaxpod.models.llama import hf_io, load_tokenizer, lora, peft_io
from jaxpod.runtime import make_mesh
from jaxpod.sample import SampleConfig, run

from sample_fixtures import PROMPTS


@pytest.mark.slow
def test_sample_with_an_adapter(tiny_ckpt, tmp_path):
  """The records are the adapted model's greedy completions (not the base's: the adapter reaches the engine) and
  name checkpoint + adapter; an adapter saved for another base fails in one line before JAX."""
  mesh = make_mesh(devices=jax.devices()[:1])
  adapted = lora.attach(hf_io.load(tiny_ckpt, mesh), lora.LoraConfig(rank=2), mesh=mesh)
  rng = np.random.default_rng(0)
  lora.set_adapters(adapted, {k: (a, rng.normal(0, 0.5, b.shape)) for k, (a, b) in lora.adapters(adapted).items()})
  peft_io.save_adapter(adapted, str(tmp_path / "adapter"), base_model=tiny_ckpt)
  prompts = tmp_path / "p.txt"
  prompts.write_text("\n".join(PROMPTS[:4]) + "\n")
  cfg = SampleConfig(hf=tiny_ckpt, adapter=str(tmp_path / "adapter"), prompts=str(prompts),
                     out=str(tmp_path / "o.jsonl"), max_new_tokens=6, batch_size=8, max_prompt_len=32)
  run(cfg)
  rows = [json.loads(line) for line in (tmp_path / "o.jsonl").read_text().splitlines()]
  assert rows[0]["weight_version"] == f"{tiny_ckpt}+{tmp_path / 'adapter'}"
  tok, base = load_tokenizer(tiny_ckpt), hf_io.load(tiny_ckpt, mesh)
  ids = [tok.encode(p) for p in PROMPTS[:4]]
  tokens = np.zeros((4, 40), np.int32)  # causal: padding after a row does not change its logits
  for i, (p, r) in enumerate(zip(ids, rows)):
    tokens[i, :len(p) + len(r["token_ids"])] = p + r["token_ids"]
  greedy = {}  # sampled tokens that are each model's argmax (teacher-forced)
  for name, model in (("adapted", adapted), ("base", base)):
    top = np.argmax(np.asarray(jax.jit(lambda t, m=model: m(t).logits)(tokens)), -1)
    greedy[name] = sum(int(np.sum(top[i, len(p) - 1:len(p) - 1 + len(r["token_ids"])] == r["token_ids"]))
                       for i, (p, r) in enumerate(zip(ids, rows)))
  total = sum(len(r["token_ids"]) for r in rows)
  assert greedy["adapted"] == total and greedy["base"] < total, (greedy, total)
  other = lora.attach(hf_io.load(tiny_ckpt, mesh), lora.LoraConfig(rank=2, target_modules=("q_proj",)), mesh=mesh)
  peft_io.save_adapter(other, str(tmp_path / "other"))
  with open(tmp_path / "other" / "adapter_config.json") as f:
    bad = json.load(f) | {"target_modules": ["q_proj", "v_proj"]}
  (tmp_path / "other" / "adapter_config.json").write_text(json.dumps(bad))
  with pytest.raises(ValueError, match="lacks") as e:
    run(dataclasses.replace(cfg, adapter=str(tmp_path / "other")))
  assert "\n" not in str(e.value)
