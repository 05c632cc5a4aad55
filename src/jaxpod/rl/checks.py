"""Invariant 7 for `jaxpod rl`: every config error that can be found before JAX starts, in one line.

Checked here, in this order: the rewards resolve (a plugin not found), the hosts split the batch
into whole groups, storage is reachable (and shared when several jobs or hosts use it), the
starting checkpoint exists, and the task's prompts and answers fit the engine's context
(prompts are never truncated). `GRPOConfig` itself refuses n < 2.
"""
from __future__ import annotations

from jaxpod.rl.config import RLConfig
from jaxpod.runtime import storage

SAMPLE_PROBLEMS = 256  # training problems per stream tokenized by the length check (plus the whole held-out set)


def before_jax(cfg: RLConfig) -> None:
  """Raise ValueError (one line, naming the field and the fix) for anything wrong with `cfg`."""
  from jaxpod.rl.rewards import Scorer
  Scorer(cfg.rewards, cfg.reward_weights, cfg.task)
  hosts = cfg.runtime.hosts()
  if cfg.role != "rollout":
    from jaxpod.rl.policy import check_rows
    check_rows(cfg, hosts.process_count)
  storage.check_url(cfg.trainer.runs_dir, "trainer.runs_dir")
  several = hosts.process_count > 1 or cfg.topology == "disaggregated"
  if several and cfg.role != "auto":
    storage.check_shared(cfg.trainer.runs_dir, "trainer.runs_dir", 2)
  if cfg.model.hf and not storage.exists(storage.join(cfg.model.hf, "config.json")):
    raise FileNotFoundError(f"model.hf={cfg.model.hf}: no config.json there; point it at a HF checkpoint folder (families: jaxpod.models.llama.families)")
  check_lengths(cfg)


def check_lengths(cfg: RLConfig) -> None:
  """Prompts within rollout.max_prompt_len, answers + EOS within max_new_tokens, both within the model's positions."""
  from jaxpod.rl.policy import model_config, tokenizer_for
  from jaxpod.rl.sampling import answer_ids
  r = cfg.rollout
  tok = tokenizer_for(cfg)
  problems = cfg.task.eval_set(cfg.trainer.seed)
  for stream in (1, 2):
    problems += cfg.task.train_problems(cfg.trainer.seed, stream, 0, SAMPLE_PROBLEMS)
  longest = max(problems, key=lambda p: len(tok.encode(p.prompt)))
  n = len(tok.encode(longest.prompt))
  if n > r.max_prompt_len:
    raise ValueError(f"rl.task prompts reach {n} tokens (e.g. {longest.prompt!r}) but rl.rollout.max_prompt_len="
                     f"{r.max_prompt_len}; raise it to >= {n} (prompts are never truncated)")
  answer = max(len(answer_ids(tok, a)) + 1 for p in problems for a in (p.answer, cfg.task.demonstration(p)))
  if answer > r.max_new_tokens:
    raise ValueError(f"rl.task answers need {answer} tokens with EOS but rl.rollout.max_new_tokens="
                     f"{r.max_new_tokens}; raise it to >= {answer}")
  llama = model_config(cfg, cfg.model.hf or None)
  if r.max_prompt_len + r.max_new_tokens > llama.max_position_embeddings:
    raise ValueError(f"rl.rollout.max_prompt_len + max_new_tokens = {r.max_prompt_len + r.max_new_tokens} exceeds "
                     f"the model's max_position_embeddings={llama.max_position_embeddings}; lower them or raise "
                     "model.max_position_embeddings")
  if cfg.model.hf:
    top = max(max(tok.encode(p.prompt)) for p in problems)
    if top >= llama.vocab_size:
      raise ValueError(f"the tokenizer of model.hf={cfg.model.hf} makes id {top} >= its vocab_size {llama.vocab_size}")
  elif llama.vocab_size < 259:
    raise ValueError(f"model.vocab_size={llama.vocab_size} is too small for the byte-level tokenizer; use >= 259")
