"""TRL's side of `jaxpod bench rl --against trl`: GRPOTrainer on the same checkpoint, prompts and settings.

    python -m jaxpod.bench.rl.trl_side --model DIR --prompts problems.jsonl --steps 20 --out trl.json [...]

Runs in its own process (torch and TRL never share a process with JAX). TRL generates with HF
`generate` (no vLLM) on the CPU. What is matched to jaxpod's `jaxpod rl --model.hf DIR --task.type
dataset` run with the same options:
  prompts      the same training problems in the same order (`DatasetProblems.train_problems` of jaxpod's
               colocated stream; TRL's own shuffling off) and the same held-out split
  reward       the same verifier (exact_match | gsm8k | boxed) on the decoded completion, 0 when the
               completion was cut at max_completion_length (jaxpod rewards only finished samples)
  algorithm    num_generations, prompts per step (per_device_train_batch_size = prompts x n, one
               optimizer step per generation batch), learning rate with 5 warm-up steps then constant,
               AdamW (0.9, 0.99), grad-norm clip 1.0, epsilon / epsilon_high, beta 0, scale_rewards,
               loss normalisation (jaxpod token -> TRL dapo, sequence -> grpo, constant -> dr_grpo),
               temperature, max new tokens
Reported (JSON), over steps 3.. as `jaxpod bench rl` measures jaxpod's: seconds per step (median),
and where they go (medians per step: `generate_s` in HF `generate`, `score_s` the rest of
`_generate_and_score_completions`: decoding, rewards and the log-prob forward pass, `train_s` the
rest of the step: forward, backward and optimizer), completion tokens per second of step time
(TRL's generation is inside its step), reward per wall-clock second (rewards of every trained
sample, summed, over those steps' time); held-out greedy accuracy after the steps; TRL's and
torch's versions.
"""
from __future__ import annotations

import dataclasses
import json
import statistics
import tempfile
import time

LOSS_TYPES = {"token": "dapo", "sequence": "grpo", "constant": "dr_grpo"}
RL_STREAM = 2  # jaxpod's colocated training stream (rl/colocated.py)


@dataclasses.dataclass(frozen=True)
class TRLArm:
  """Options of TRL's run (each the same as the jaxpod option named in the comment)."""

  model: str = ""  # HF checkpoint folder with tokenizer files (--model.hf)
  prompts: str = ""  # prompt file (--task.path)
  prompt_column: str = "prompt"  # --task.prompt_column
  answer_column: str = "answer"  # --task.answer_column
  verifier: str = "exact_match"  # --task.verifier, also the reward
  eval_size: int = 128  # --task.eval_size
  steps: int = 20  # optimizer steps (--trainer.steps)
  num_prompts_per_step: int = 16  # --grpo.num_prompts_per_step
  num_generations: int = 8  # --grpo.num_generations
  lr: float = 3e-4  # --grpo.lr
  epsilon: float = 0.2  # --grpo.epsilon
  epsilon_high: float = 0.28  # --grpo.epsilon_high
  loss_norm: str = "token"  # --grpo.loss_norm
  scale_rewards: str = "group"  # --grpo.scale_rewards
  temperature: float = 1.0  # --rollout.temperature
  max_new_tokens: int = 20  # --rollout.max_new_tokens
  seed: int = 0  # --trainer.seed
  threads: int = 0  # torch intra-op threads (0: torch's default)
  out: str = ""  # JSON results


def _problems(arm: TRLArm):
  from jaxpod.problems.dataset import DatasetProblems
  task = DatasetProblems(path=arm.prompts, prompt_column=arm.prompt_column, answer_column=arm.answer_column,
                         verifier=arm.verifier, eval_size=arm.eval_size)
  train = task.train_problems(arm.seed, RL_STREAM, 0, arm.steps * arm.num_prompts_per_step)
  return task, train, task.eval_set(arm.seed)


def _reward_fn(task, tokenizer):
  from jaxpod.problems.base import Problem
  from jaxpod.problems.rewards import resolve
  verify = resolve(task.correct_reward, task)
  eos = set(tokenizer.all_special_ids) & {tokenizer.eos_token_id}

  def reward(prompts, completions, completion_ids, answer, **_):
    return [verify(Problem(p, a), c, bool(ids) and ids[-1] in eos)
            for p, c, ids, a in zip(prompts, completions, completion_ids, answer)]
  reward.__name__ = task.correct_reward
  return reward


def held_out_accuracy(model, tokenizer, task, problems, max_new_tokens: int, batch: int = 64) -> float:
  """Greedy accuracy of the HF model on `problems` with the task's verifier (left-padded batches)."""
  import torch
  from jaxpod.problems.rewards import resolve
  verify = resolve(task.correct_reward, task)
  tokenizer.padding_side = "left"
  right = 0
  for i in range(0, len(problems), batch):
    chunk = problems[i:i + batch]
    enc = tokenizer([p.prompt for p in chunk], return_tensors="pt", padding=True)
    with torch.no_grad():
      out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    for p, row in zip(chunk, out[:, enc["input_ids"].shape[1]:].tolist()):
      finished = tokenizer.eos_token_id in row
      text = tokenizer.decode(row[:row.index(tokenizer.eos_token_id)] if finished else row, skip_special_tokens=True)
      right += bool(verify(p, text, finished))
  return right / len(problems)


def run(arm: TRLArm) -> dict:
  """Train with TRL's GRPOTrainer as configured; the results (see the module docstring)."""
  from jaxpod.runtime.extras import require
  torch = require("torch", "TRL's side of `jaxpod bench rl --against trl`")
  trl = require("trl", "`jaxpod bench rl --against trl`")
  from datasets import Dataset
  from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
  if arm.threads:
    torch.set_num_threads(arm.threads)
  task, train, held = _problems(arm)
  tokenizer = AutoTokenizer.from_pretrained(arm.model)
  model = AutoModelForCausalLM.from_pretrained(arm.model, dtype=torch.float32)
  data = Dataset.from_dict({"prompt": [p.prompt for p in train], "answer": [p.answer for p in train]})
  step_ends: list[float] = []
  spans = {"generate": 0.0, "generate_and_score": 0.0}  # seconds inside TRL's methods during the current step
  split: list[dict] = []  # per step: those spans

  class Clock(TrainerCallback):
    def on_step_end(self, args, state, control, **kw):
      step_ends.append(time.perf_counter())
      split.append(dict(spans))
      spans.update(generate=0.0, generate_and_score=0.0)

  def timed(name, method):
    def wrapper(*args, **kwargs):
      t = time.perf_counter()
      try:
        return method(*args, **kwargs)
      finally:
        spans[name] += time.perf_counter() - t
    return wrapper

  rows = arm.num_prompts_per_step * arm.num_generations
  with tempfile.TemporaryDirectory() as tmp:
    cfg = trl.GRPOConfig(
        output_dir=tmp, per_device_train_batch_size=rows, gradient_accumulation_steps=1, num_iterations=1,
        num_generations=arm.num_generations, max_completion_length=arm.max_new_tokens, temperature=arm.temperature,
        learning_rate=arm.lr, lr_scheduler_type="constant_with_warmup", warmup_steps=5, adam_beta2=0.99,
        weight_decay=0.0, max_grad_norm=1.0, epsilon=arm.epsilon, epsilon_high=arm.epsilon_high, beta=0.0,
        loss_type=LOSS_TYPES[arm.loss_norm], scale_rewards=arm.scale_rewards, max_steps=arm.steps, logging_steps=1,
        report_to=[], save_strategy="no", shuffle_dataset=False, seed=arm.seed, use_cpu=True, bf16=False,
        gradient_checkpointing=False,  # TRL turns it on by default; this model fits without it (faster for TRL)
        disable_tqdm=True)
    trainer = trl.GRPOTrainer(model=model, reward_funcs=_reward_fn(task, tokenizer), args=cfg, train_dataset=data,
                              processing_class=tokenizer, callbacks=[Clock()])
    # where TRL's step time goes: its own methods, timed on this instance (self._generate(...) finds these)
    trainer._generate = timed("generate", trainer._generate)
    trainer._generate_and_score_completions = timed("generate_and_score", trainer._generate_and_score_completions)
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
  logs = [r for r in trainer.state.log_history if "reward" in r]
  steps = [b - a for a, b in zip([t0] + step_ends[:-1], step_ends)]
  # steady state as jaxpod's bench measures it: steps 3.. (the first ones include start-up work)
  later = list(zip(steps, logs, split))[2:] or list(zip(steps, logs, split))
  seconds = sum(s for s, _, _ in later)
  out = {"trl_version": trl.__version__, "torch_version": torch.__version__, "steps": len(steps),
         "seconds_per_step": statistics.median(s for s, _, _ in later),
         "generate_s": statistics.median(t["generate"] for _, _, t in later),
         "score_s": statistics.median(t["generate_and_score"] - t["generate"] for _, _, t in later),
         "train_s": statistics.median(s - t["generate_and_score"] for s, _, t in later),
         "tokens_per_s": sum(r.get("completions/mean_length", 0.0) * rows for _, r, _ in later) / seconds,
         "reward_per_s": sum(r["reward"] * rows for _, r, _ in later) / seconds, "wall_s": wall,
         "reward_curve": [[i, r["reward"]] for i, r in enumerate(logs)],
         "accuracy_end": held_out_accuracy(model.eval(), tokenizer, task, held, arm.max_new_tokens)}
  if arm.out:
    with open(arm.out, "w") as f:
      json.dump(out, f, indent=1)
  return out


def main(argv=None) -> int:
  import draccus
  out = run(draccus.parse(TRLArm, args=argv))
  print(json.dumps({k: v for k, v in out.items() if k != "reward_curve"}))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
