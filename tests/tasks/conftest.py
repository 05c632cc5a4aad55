"""One tiny byte-level Llama checkpoint and one pair file for every preference test of the session."""
from __future__ import annotations

import json

import numpy as np
import pytest

from jaxpod.data import sort_digits

TINY = dict(vocab_size=259, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, max_position_embeddings=32, tie_word_embeddings=True, bos_token_id=256,
            eos_token_id=(257,), pad_token_id=258)
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory) -> str:
  """A random tiny Llama as a HF checkpoint (config.json + safetensors) with byte-level tokenizer files."""
  import jax
  from flax import nnx
  from jaxpod.models.llama import Llama, LlamaConfig, hf_io
  from jaxpod.models.llama.tokenizer import save_byte_tokenizer
  folder = str(tmp_path_factory.mktemp("pref_ckpt"))
  with jax.default_device(jax.devices("cpu")[0]):
    hf_io.save(Llama(LlamaConfig(**TINY), rngs=nnx.Rngs(params=0)), folder)
  save_byte_tokenizer(folder)
  return folder


def sort_rows(count: int, seed: int = 3) -> list[dict]:
  """Text pairs: prompt "sort:<digits>=", chosen the sorted digits, rejected the teacher's habit (or a reversal)."""
  rows = []
  for index in range(count):
    prompt, answer = sort_digits.sort_problem(seed, 1, index, length=5)
    habit = sort_digits.teacher_habit(answer, np.random.default_rng(index), 1.0)
    rows.append({"prompt": prompt, "chosen": answer, "rejected": habit if habit != answer else answer[::-1] + "0"})
  return rows


@pytest.fixture(scope="session")
def pair_file(tmp_path_factory) -> str:
  """128 text pairs as JSONL."""
  path = tmp_path_factory.mktemp("pref_pairs") / "pairs.jsonl"
  path.write_text("".join(json.dumps(r) + "\n" for r in sort_rows(128)))
  return str(path)


def pref_args(runs_dir, ckpt: str, pairs: str, steps: int = 4, **overrides) -> list[str]:
  """`jaxpod train` arguments for the tiny checkpoint on the pair file (seconds per run)."""
  values = {
      "task.type": "preference", "task.hf": ckpt, "task.data.path": pairs, "task.data.global_batch_size": 8,
      "task.data.eval_batch_size": 8, "task.data.eval_pairs": 16, "task.data.max_prompt_length": 12,
      "task.data.max_length": 20, "task.optim.lr": 1e-3, "task.optim.warmup_steps": 1,
      "trainer.steps": steps, "trainer.log_every": 1, "trainer.ema": 0.0, "trainer.runs_dir": str(runs_dir),
      "trainer.progress": "false", "trainer.plot": "false", "tracker.tensorboard": "false",
      "runtime.compile_cache.min_compile_time_s": 0,
  }
  values.update({k.replace("__", "."): v for k, v in overrides.items()})
  return [f"--{k}={v}" for k, v in values.items() if v is not None]
