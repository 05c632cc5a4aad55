"""Invariant 7 for `jaxpod rl`: every config error that can be found before JAX starts, in one line.

A field's own range is checked by its dataclass when the config is parsed (`RLConfig` and its sections;
the rollout section's sampling options by `jaxpod.sample.SamplingOptions`, naming `rl.rollout.<field>`).
Everything that depends on several fields, the hosts, the devices, files or the problem set is checked here,
in this order: the rewards resolve (a plugin not found); per job (the trainer, the rollout workers):
rows per step split over its hosts in whole groups and over its data-parallel devices (the warm-up's
batch and GRPO's prompts x samples), the engine's decode slots over its data-parallel devices; storage is
reachable (and shared when several jobs or hosts use it); the starting checkpoint exists; the problem set's
prompts and answers fit the engine's context (prompts are never truncated; every turn of the teacher's
episodes and every context a turn continues from: a single-turn set's episode is one turn). A
multi-turn set is scored by its environment (`check_environment`), in either topology. Each error names the
field the user typed and the fix. The trainer and the engine check again at run time (a library's own
guard); with these checks passed they never fire.
"""
from __future__ import annotations

import math

from jaxpod.policy.spec import PolicySpec
from jaxpod.rl.config import RLConfig
from jaxpod.runtime import storage

SAMPLE_PROBLEMS = 256  # training problems per stream tokenized by the length check (plus the whole held-out set)


def before_jax(cfg: RLConfig, policy: PolicySpec | None = None) -> None:
  """Raise ValueError (one line, naming the field and the fix) for anything wrong with `cfg`; `policy`: the run's
  (its tokenizer, read here first; None: the model section's)."""
  from jaxpod.problems.rewards import Scorer
  Scorer(cfg.rewards, cfg.reward_weights, cfg.problems)
  check_environment(cfg)
  hosts = cfg.runtime.hosts()
  for job, count in jobs(cfg, hosts.process_count):
    check_rows(cfg, job, count, hosts.devices_per_host)
  storage.check_url(cfg.trainer.runs_dir, "trainer.runs_dir")
  several = hosts.process_count > 1 or cfg.topology == "disaggregated"
  if several and cfg.role != "auto":
    storage.check_shared(cfg.trainer.runs_dir, "trainer.runs_dir", 2)
  if cfg.model.hf and not storage.exists(storage.join(cfg.model.hf, "config.json")):
    raise FileNotFoundError(f"model.hf={cfg.model.hf}: no config.json there; point it at a HF checkpoint folder (families: jaxpod.models.llama.families)")
  check_lengths(cfg, policy or PolicySpec(cfg.model))


def check_environment(cfg: RLConfig) -> None:
  """A multi-turn problem set: its environment resolves, and it is what scores the episodes (either topology)."""
  name = type(cfg.problems).__name__
  if cfg.problems.environment() is None:  # resolves the environment: a one-line error naming the field if it cannot
    return
  if tuple(cfg.rewards) != ("exact_match",) or cfg.reward_weights:
    raise ValueError(f"rl.rewards={list(cfg.rewards)}: the episodes of a multi-turn problem set ({name}) are scored "
                     "by its environment's rewards; leave rl.rewards and rl.reward_weights at their defaults")


def jobs(cfg: RLConfig, process_count: int) -> list[tuple[str, int]]:
  """(job, hosts) of the JAX jobs this command starts or joins: trainer and/or rollout."""
  if cfg.topology == "colocated":
    return [("trainer", process_count)]
  if cfg.role == "auto":
    return [("trainer", cfg.trainer_hosts), ("rollout", cfg.rollout.hosts)]
  return [(cfg.role, process_count)]


def check_rows(cfg: RLConfig, job: str, hosts: int, devices_per_host: int | None) -> None:
  """The job's rows over its hosts (whole groups each) and its data-parallel devices (when the device count is
  known before JAX starts: simulated hosts, or runtime.devices_per_host); the engine's slots over the latter."""
  g, w, r = cfg.grpo, cfg.warmup, cfg.rollout
  dp, where = None, ""
  if devices_per_host is not None:
    try:
      dp = cfg.mesh.data_parallel_size(hosts * devices_per_host)
    except ValueError as e:
      raise ValueError(f"rl.mesh: {e} (the {job} job: {hosts} host(s) x {devices_per_host} devices)") from None
    where = f"the data-parallel size {dp} of the {job} job (mesh data*fsdp over {hosts} x {devices_per_host} devices)"
  if job == "trainer":
    if g.num_prompts_per_step % hosts or (dp and g.rows % dp):
      step = math.lcm(hosts, dp // math.gcd(g.num_generations, dp)) if dp else hosts
      over = f"{hosts} host(s) in whole groups" + (f" and {where}" if dp else "")
      raise ValueError(f"rl.grpo.num_prompts_per_step={g.num_prompts_per_step}: {g.num_prompts_per_step} prompts x "
                       f"{g.num_generations} samples = {g.rows} rows per step do not split over {over}; use a "
                       f"multiple of {step}")
    if not (cfg.model.hf or w.steps == 0) and (w.batch_size % hosts or (dp and w.batch_size % dp)):
      step = math.lcm(hosts, dp or 1)
      raise ValueError(f"rl.warmup.batch_size={w.batch_size} does not split over {hosts} host(s)"
                       + (f" and {where}" if dp else "") + f"; use a multiple of {step}")
  if not dp:
    return
  slots = [("eval_slots", r.eval_slots)] if job == "trainer" else []
  if job == "rollout" or cfg.topology == "colocated":
    slots.append(("batch_size", r.batch_size))
  for name, value in slots:
    if value % dp:
      raise ValueError(f"rl.rollout.{name}={value} (decode slots) does not split over {where}; use a multiple of {dp}")


def check_lengths(cfg: RLConfig, policy: PolicySpec) -> None:
  """Prompts within rollout.max_prompt_len, answers + EOS within max_new_tokens, both within the model's positions."""
  r = cfg.rollout
  tok = policy.tokenizer
  problems = cfg.problems.eval_set(cfg.trainer.seed)
  for stream in (1, 2):
    problems += cfg.problems.train_problems(cfg.trainer.seed, stream, 0, SAMPLE_PROBLEMS)
  longest = max(problems, key=lambda p: len(tok.encode(p.prompt)))
  n = len(tok.encode(longest.prompt))
  if n > r.max_prompt_len:
    raise ValueError(f"rl.problems prompts reach {n} tokens (e.g. {longest.prompt!r}) but rl.rollout.max_prompt_len="
                     f"{r.max_prompt_len}; raise it to >= {n} (prompts are never truncated)")
  llama = policy.llama
  check_turns(cfg, tok, problems, policy.stop_ids[0])
  if r.cache_len > llama.max_position_embeddings:
    raise ValueError(f"rl.rollout.max_prompt_len + max_new_tokens = {r.cache_len} exceeds "
                     f"the model's max_position_embeddings={llama.max_position_embeddings}; lower them or raise "
                     "model.max_position_embeddings")
  if cfg.model.hf:
    top = max(max(tok.encode(p.prompt)) for p in problems)
    if top >= llama.vocab_size:
      raise ValueError(f"the tokenizer of model.hf={cfg.model.hf} makes id {top} >= its vocab_size {llama.vocab_size}")
  elif llama.vocab_size < 259:
    raise ValueError(f"model.vocab_size={llama.vocab_size} is too small for the byte-level tokenizer; use >= 259")


def check_turns(cfg: RLConfig, tok, problems, stop_id: int) -> None:
  """Each turn of the teacher's episodes and each answer (with EOS) within rollout.max_new_tokens, and the context
  each turn continues from (prompt, earlier turns, observations) within rollout.max_prompt_len. A single-turn
  set's episode is the prompt and one turn."""
  import itertools
  from jaxpod.problems.environments import answer_ids, demonstration
  r = cfg.rollout
  turn, context = (0, None), (0, None)
  for p in problems:
    turn = max(turn, (len(answer_ids(tok, p.answer)) + 1, p.prompt))  # the answer, said in one turn
    e = demonstration(cfg.problems, tok, p, stop_id)
    start = len(e.prompt_ids)  # where the current run of policy or observation tokens begins
    for mine, run in itertools.groupby(e.from_policy):
      length = len(list(run))
      if mine:  # a turn: `length` tokens sampled after a context of `start` tokens
        turn, context = max(turn, (length, p.prompt)), max(context, (start, p.prompt))
      start += length
  if turn[0] > r.max_new_tokens:
    raise ValueError(f"rl.problems turns need {turn[0]} tokens with EOS (e.g. on {turn[1]!r}) but rl.rollout."
                     f"max_new_tokens={r.max_new_tokens}; raise it to >= {turn[0]}")
  if context[0] > r.max_prompt_len:
    raise ValueError(f"rl.problems episodes continue from {context[0]} tokens (prompt, turns and observations, e.g. on "
                     f"{context[1]!r}) but rl.rollout.max_prompt_len={r.max_prompt_len}; raise it to >= {context[0]}")
