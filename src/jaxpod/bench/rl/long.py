"""The long-completion workload of `jaxpod bench rl --against trl`: day-by-day word problems, a BPE tokenizer, a
Llama-shaped policy, worked solutions of 128-512 tokens.

A problem is a count that changes the same way every day for `steps` days (`Bo has 42 apples. Every day she
buys 8 more and loses 4. How many apples does she have after 10 days?`); its worked solution writes one numbered
line per day with the running count (`(1) 42+8=50, 50-4=46`), then `#### <count>` (GSM8K's format: the gsm8k
verifier on both sides). The answer needs the length: each line needs the one before. Every line depends only on
the line before and two amounts of the question, so a policy of a few million parameters learns it in a warm-up
of minutes; a story of distinct events did not (the line for event k must find event k in the question: after
300 warm-up steps the policy skipped and repeated events and no held-out problem came out right, so neither side
earned any reward to compare). The warm-up's teacher is flawed as `jaxpod data word-problems`' is: it reads the
day's take-away as a sum with probability `teacher_wrong_op` per day, so RL has a habit to unlearn.
`problems.jsonl` (RL prompts, held-out split) and `sft.jsonl` (the teacher's rows, other questions) are a pure
function of the seed.

The tokenizer is a byte-level BPE (`tokenizers`' trainer, offline) fitted on the teacher's rows, written as
HF files (BOS prepended; EOS, PAD) so jaxpod and TRL load the same ids; the policy is a random Llama
(`SIZES`) fine-tuned here on the teacher's rows (next-token loss on the solution and EOS; AdamW) and
saved as a HF checkpoint with those tokenizer files: the one checkpoint both sides start from.
Sizes: `small` (default: ~2M parameters, solutions of 125-215 tokens; a repeat takes minutes on 2 cores) and
`full` (~19M parameters, solutions of 360-460 tokens).
"""
from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from jaxpod.data.word_problems import NAMES, THINGS

MORE = ("gets {b} more", "buys {b} more", "finds {b} more")  # present tense: what happens every day
LESS = ("gives away {b}", "loses {b}", "sells {b}")


@dataclasses.dataclass(frozen=True)
class LongWorkload:
  """One size of the long workload: the problems, the policy's architecture, the GRPO step's shape."""

  name: str  # small | full
  steps: tuple[int, int]  # days per problem, a line of the solution each (inclusive range)
  vocab: int  # BPE vocabulary (specials included)
  hidden: int  # Llama hidden size
  layers: int  # decoder blocks
  heads: int  # query heads (kv heads: half)
  mlp: int  # MLP width
  max_prompt_len: int  # prompt tokens
  max_new_tokens: int  # completion tokens at most
  prompts: int  # prompts per GRPO step
  generations: int  # samples per prompt
  lr: float  # GRPO learning rate
  warmup_steps: int  # supervised steps of the warm-up
  warmup_batch: int  # rows per warm-up step
  teacher_wrong_op: float = 0.1  # the teacher adds instead of taking away with this probability, per day
  problems: int = 1000  # rows of problems.jsonl
  sft: int = 4000  # rows of sft.jsonl


SIZES = {
    "small": LongWorkload("small", (9, 11), 512, 192, 4, 4, 512, 32, 224, 4, 8, 1e-5, 800, 32),
    "full": LongWorkload("full", (24, 30), 2048, 512, 6, 8, 1408, 32, 480, 8, 8, 1e-4, 1500, 32),
}


def chain(rng: np.random.Generator, w: LongWorkload) -> tuple[str, list[tuple[int, int]]]:
  """(question, [(count, 0), (gain, loss) per day]) of one problem: the count stays within 0..199."""
  name, thing = NAMES[rng.integers(len(NAMES))], THINGS[rng.integers(len(THINGS))]
  days = int(rng.integers(w.steps[0], w.steps[1] + 1))
  while True:
    gain, loss = (int(x) for x in rng.integers(1, 10, size=2))
    lowest = 10 + max(loss - gain, 0) * days  # a shrinking count starts high enough to last every day
    highest = 199 - max(gain - loss, 0) * days - 9  # a growing one low enough, with the last day's gain before its loss
    if lowest <= highest:
      break
  count = int(rng.integers(lowest, min(lowest + 50, highest) + 1))
  question = (f"{name} has {count} {thing}. Every day she {MORE[rng.integers(len(MORE))].format(b=gain)} and "
              f"{LESS[rng.integers(len(LESS))].format(b=loss)}. How many {thing} does she have after {days} days?")
  return question, [(count, 0)] + [(gain, loss)] * days


def solution(events: list[tuple[int, int]], wrong: np.ndarray | None = None) -> str:
  """The worked solution: one line per day, numbered, with the running count (`(3) 41+7=48, 48-3=45`), then
  `#### <count>`; `wrong[i]`: day i's take-away read as a sum (the flawed teacher)."""
  count, lines = events[0][0], []
  for i, (gain, loss) in enumerate(events[1:]):
    up = count + gain
    down = up + loss if wrong is not None and wrong[i] else up - loss
    lines.append(f"({i + 1}) {count}+{gain}={up}, {up}{'+' if down > up else '-'}{loss}={down}")
    count = down
  return "\n".join(lines) + f"\n#### {count}"


def build(out: str, w: LongWorkload, seed: int = 0) -> dict[str, str]:
  """problems.jsonl and sft.jsonl under out (distinct questions); {split: path}."""
  rng = np.random.default_rng([seed, 36])
  seen: set[str] = set()
  paths = {}
  os.makedirs(out, exist_ok=True)
  for split, count in (("problems", w.problems), ("sft", w.sft)):
    rows = []
    while len(rows) < count:
      question, events = chain(rng, w)
      if question in seen:
        continue
      seen.add(question)
      wrong = rng.random(len(events)) < w.teacher_wrong_op if split == "sft" else None
      rows.append(json.dumps({"question": question, "answer": solution(events, wrong)}))
    paths[split] = os.path.join(out, f"{split}.jsonl")
    with open(paths[split], "w") as f:
      f.write("".join(r + "\n" for r in rows))
  return paths


def train_tokenizer(sft: str, folder: str, vocab: int) -> None:
  """A byte-level BPE fitted on the rows of `sft` (question + answer), written as HF tokenizer files in folder."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
  bos, eos, pad = "<|bos|>", "<|eos|>", "<|pad|>"
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[bos, eos, pad],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
  rows = [json.loads(line) for line in open(sft)]
  tok.train_from_iterator([r["question"] + " " + r["answer"] for r in rows], trainer)
  tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, tok.token_to_id(bos))])
  os.makedirs(folder, exist_ok=True)
  tok.save(os.path.join(folder, "tokenizer.json"))
  config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos, "pad_token": pad,
            "model_max_length": 1 << 30, "clean_up_tokenization_spaces": False}
  with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
    json.dump(config, f, indent=2)


def llama_config(w: LongWorkload, tokenizer):
  """The policy's architecture (Llama: GQA with half the query heads, untied head, RoPE)."""
  from jaxpod.models.llama.config import LlamaConfig
  return LlamaConfig(vocab_size=w.vocab, hidden_size=w.hidden, intermediate_size=w.mlp, num_hidden_layers=w.layers,
                     num_attention_heads=w.heads, num_key_value_heads=max(w.heads // 2, 1),
                     max_position_embeddings=w.max_prompt_len + w.max_new_tokens, tie_word_embeddings=False,
                     bos_token_id=tokenizer.bos_id, eos_token_id=tuple(tokenizer.eos_ids),
                     pad_token_id=tokenizer.pad_id)


def _rows(tokenizer, rows: list[dict], w: LongWorkload, eos: int) -> tuple[np.ndarray, np.ndarray]:
  """tokens [N, L] and the loss mask (1 where the next token is the solution's or EOS)."""
  length = w.max_prompt_len + w.max_new_tokens
  tokens = np.full((len(rows), length), tokenizer.pad_id, np.int32)
  mask = np.zeros((len(rows), length), np.int32)
  for i, r in enumerate(rows):
    prompt = tokenizer.encode(r["question"])[:w.max_prompt_len]
    answer = (tokenizer.encode(r["answer"], add_special_tokens=False) + [eos])[:w.max_new_tokens]
    row = prompt + answer
    tokens[i, :len(row)] = row
    mask[i, len(prompt) - 1:len(row) - 1] = 1
  return tokens, mask


def warm_policy(root: str, w: LongWorkload, warmup_steps: int | None = None) -> tuple[str, str]:
  """(HF checkpoint of the warmed-up policy with the BPE tokenizer files, problems.jsonl) under root."""
  import shutil
  import jax
  import optax
  from flax import nnx
  from jaxpod.models.llama import hf_io
  from jaxpod.models.llama.model import init, weight_decay_mask
  from jaxpod.models.llama.tokenizer import load_tokenizer
  paths = build(os.path.join(root, "data"), w)
  policy = os.path.join(root, "policy")
  train_tokenizer(paths["sft"], policy, w.vocab)
  tokenizer = load_tokenizer(policy)
  cfg = llama_config(w, tokenizer)
  graphdef, params = nnx.split(init(cfg, 0))
  tokens, mask = _rows(tokenizer, [json.loads(line) for line in open(paths["sft"])], w, tokenizer.eos_ids[0])
  steps = w.warmup_steps if warmup_steps is None else warmup_steps
  sched = optax.warmup_cosine_decay_schedule(0.0, 3e-3, max(steps // 10, 1), max(steps, 2), 3e-4)
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(sched, b1=0.9, b2=0.99, weight_decay=0.01,
                                                               mask=weight_decay_mask))

  def step(p, opt, t, m):
    (loss, _), g = jax.value_and_grad(lambda q: _masked_loss(graphdef, q, t, m), has_aux=True)(p)
    updates, opt = tx.update(g, opt, p)
    return optax.apply_updates(p, updates), opt, loss

  fn, opt = jax.jit(step, donate_argnums=(0, 1)), tx.init(params)
  rng = np.random.default_rng(1)
  for k in range(steps):
    pick = rng.choice(len(tokens), w.warmup_batch, replace=False)
    params, opt, loss = fn(params, opt, tokens[pick], mask[pick])
    if k % 50 == 0 or k == steps - 1:
      print(f"bench rl --against trl: long warm-up step {k}: loss {float(loss):.3f}", flush=True)
  hf_io.save(nnx.merge(graphdef, params), os.path.join(root, "policy-weights"))
  for name in os.listdir(os.path.join(root, "policy-weights")):
    shutil.copy(os.path.join(root, "policy-weights", name), policy)
  return policy, paths["problems"]


def _masked_loss(graphdef, params, tokens, mask):
  """Mean next-token cross-entropy where mask[:, t] marks that tokens[:, t + 1] is trained on."""
  import jax.numpy as jnp
  import optax
  from jaxpod.models.llama.model import forward
  logits = forward(graphdef, params, tokens[:, :-1]).logits
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:])
  m = mask[:, :-1] > 0
  return jnp.sum(jnp.where(m, ce, 0.0)) / jnp.maximum(jnp.sum(m), 1), None
