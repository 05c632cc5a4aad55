"""What the preference task does before its first step, on every host (SPMD): the built-in default's warm-up run
(the policy's `WarmupTask`, `jaxpod rl`'s too) and on-policy pairs, precomputed reference log-probs, and the default's
exact-match evaluator. The engine is set up and the held-out problems are evaluated as RL does (`jaxpod.policy`:
`engine.make_sampler`, `evaluate.Accuracy` on the `sort` problem set: the same problems as
`jaxpod.data.sort_digits.held_out`).

    train(warmup_config(cfg, folder))                             # the policy's warm-up: imitating the flawed teacher
    arrays, counts = sort_pairs(graphdef, params, mesh, sort, tokenizer, seed, max_length)  # chosen: correct
    ref_NxP = reference_logps(graphdef, params, arrays, mesh, batch)                 # [N, 2] summed answer log-probs
    accuracy = held_out_accuracy(graphdef, mesh, sort, tokenizer, seed)(params, {})  # held-out greedy exact match

Every function here is called by every host with the same arguments and runs the same programs on
the global mesh (invariant 1); each host feeds only its share of the rows. Results that must
survive a restart are written by the caller into shared storage (invariant 8).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from jaxpod.data import sort_digits
from jaxpod.data.pairs import encode_pair, stack_pairs
from jaxpod.problems.environments import answer_ids
from jaxpod.runtime import progress


def _answer_ids(tokenizer, text: str) -> list[int]:
  """`text` tokenized as the policy would generate it after a prompt (`answer_ids`: no BOS), then the EOS token."""
  return answer_ids(tokenizer, text) + [tokenizer.eos_ids[0]]


def _global(local: np.ndarray, mesh):
  """This host's rows -> the global batch array split over the data-parallel axes."""
  import jax
  from jaxpod.train.state import batch_sharding
  return jax.make_array_from_process_local_data(batch_sharding(mesh, local.ndim), local)


def _share(rows: np.ndarray) -> np.ndarray:
  """This host's contiguous share of globally indexed rows."""
  import jax
  per = len(rows) // jax.process_count()
  return rows[jax.process_index() * per:(jax.process_index() + 1) * per]


def warmup_config(cfg, folder: str):
  """The TrainConfig of the default's supervised warm-up (`policy.warmup.WarmupTask`, the one `jaxpod rl` runs) in
  `<folder>/warmup`, exported to `<folder>/warmup/hf`: a fresh `task.model` imitating the flawed teacher
  (`SortProblems(teacher_dedup=...)`) on `task.sort.warmup_*`; a preempted rerun resumes it from its checkpoint."""
  from jaxpod.policy.engine import EngineOptions
  from jaxpod.policy.spec import PolicyModelConfig, PolicySpec
  from jaxpod.policy.warmup import WarmupConfig, warmup_run
  from jaxpod.problems import SortProblems
  from jaxpod.problems.rewards import VerifiedProblems
  pc, sort = cfg.task, cfg.task.sort
  model = PolicyModelConfig(**dataclasses.asdict(pc.model))
  problems = SortProblems(length=sort.length, eval_size=sort.eval_size, teacher_dedup=sort.teacher_dedup)
  warmup = WarmupConfig(steps=sort.warmup_steps, batch_size=sort.warmup_batch, lr=sort.warmup_lr,
                        grad_clip=sort.warmup_grad_clip)
  engine = EngineOptions(max_prompt_len=pc.data.max_prompt_length,
                         max_new_tokens=pc.data.max_length - pc.data.max_prompt_length)  # rows of max_length
  trainer = dataclasses.replace(cfg.trainer, resume="auto")  # its own checkpoint, never one named for this run
  return warmup_run(trainer, folder, PolicySpec(model), VerifiedProblems(problems, ("exact_match",), (),
                    cfg.trainer.seed), warmup, engine, runtime=cfg.runtime, mesh=cfg.mesh, tracker=cfg.tracker)


def engine_options(mesh, prompts: int, temperature: float, max_prompt_len: int, max_new_tokens: int):
  """The engine's options for sampling (or, greedy, evaluating) the default's sort problems on the training mesh: up
  to 128 decode slots (a multiple of data x fsdp), prompts up to the longest one."""
  from jaxpod.policy.engine import EngineOptions
  from jaxpod.runtime.mesh import data_parallel
  dp = data_parallel(mesh)
  rows = -(-min(128, prompts) // dp) * dp
  return EngineOptions(temperature=temperature or 1.0, max_prompt_len=max_prompt_len, max_new_tokens=max_new_tokens,
                       batch_size=rows, eval_slots=rows, steps_per_round=8)  # temperature 0: make_sampler(greedy=True)


def sort_pairs(graphdef, params, mesh, sort, tokenizer, seed: int, max_length: int) -> tuple[dict, dict]:
  """Pairs for `sort.prompts` training problems: chosen = the sorted digits; rejected = the warm-up policy's own
  sample when it is wrong (on-policy), else the teacher's habit when that differs. Returns (arrays, counts)."""
  problems = sort_digits.training_problems(seed, 10_000, sort.prompts, sort.eval_size, sort.length)
  prompt_ids = [tokenizer.encode(p) for _, p, _ in problems]
  longest = max(len(i) for i in prompt_ids)
  from jaxpod.policy.engine import make_sampler
  options = engine_options(mesh, len(prompt_ids), sort.temperature, longest, sort.length + 2)
  sampler = make_sampler(graphdef, params, mesh, options, tokenizer.eos_ids, greedy=sort.temperature == 0)
  outs = sampler.generate(prompt_ids, [seed * 100_003 + i for i, _, _ in problems])
  rows, counts = [], {"on_policy": 0, "teacher": 0, "skipped": 0}
  for (index, _, answer), ids, c in zip(problems, prompt_ids, outs):
    sampled = tokenizer.decode(c.tokens)
    if c.finish_reason == "stop" and sampled != answer:
      rejected, kind = list(c.sampled), "on_policy"  # its own tokens, the stop token included
    else:
      habit = sort_digits.teacher_habit(answer, np.random.default_rng([seed, index, 11]), 1.0)
      if habit == answer:
        counts["skipped"] += 1  # no repeated digit: nothing to prefer
        continue
      rejected, kind = _answer_ids(tokenizer, habit), "teacher"
    counts[kind] += 1
    rows.append(encode_pair(ids, _answer_ids(tokenizer, answer), rejected, max_length, tokenizer.pad_id))
  if sort.extra_repeat_pairs:
    for (index, _, answer), ids in zip(problems, prompt_ids):
      at = int(np.random.default_rng([seed, index, 13]).integers(len(answer)))
      extra = answer[:at + 1] + answer[at:]  # one digit once more than the prompt holds
      rows.append(encode_pair(ids, _answer_ids(tokenizer, answer), _answer_ids(tokenizer, extra), max_length,
                              tokenizer.pad_id))
    counts["extra_repeat"] = len(problems)
  order = np.random.default_rng([seed, 17]).permutation(len(rows))  # both kinds in train and held-out pairs
  return stack_pairs([rows[i] for i in order]), counts


def reference_logps(graphdef, params, arrays: dict, mesh, batch: int) -> np.ndarray:
  """[N, 2] summed answer log-probs of every pair's chosen and rejected answers under `params`."""
  from jax.sharding import NamedSharding, PartitionSpec
  from jaxpod import runtime
  from jaxpod.models.llama.loss import token_logps
  from jaxpod.tasks.preference_loss import answer_logps

  def logps(params, tokens_Bx2xL, answer_Bx2xL):
    tokens, answer = tokens_Bx2xL.reshape(-1, tokens_Bx2xL.shape[-1]), answer_Bx2xL.reshape(-1, answer_Bx2xL.shape[-1])
    total, _ = answer_logps(token_logps(graphdef, params, tokens[:, :-1], tokens[:, 1:]), answer[:, 1:])
    return total.reshape(-1, 2)

  fn = runtime.jit(logps, name="preference_reference_logps", out_shardings=NamedSharding(mesh, PartitionSpec()))
  n = len(arrays["tokens"])
  out = np.zeros((n, 2), np.float32)
  for start in range(0, n, batch):
    progress.touch()  # every batch is progress for the watchdog
    rows = {k: arrays[k][start:start + batch] for k in ("tokens", "answer")}
    fill = batch - len(rows["tokens"])
    rows = {k: np.concatenate([v, np.zeros((fill, *v.shape[1:]), v.dtype)]).astype(np.int32) for k, v in rows.items()}
    value = fn(params, _global(_share(rows["tokens"]), mesh), _global(_share(rows["answer"]), mesh))
    out[start:start + batch - fill] = np.asarray(value.addressable_data(0))[:batch - fill]
  return out


def held_out_accuracy(graphdef, mesh, sort, tokenizer, seed: int):
  """The policy's evaluator (`policy.evaluate.Accuracy`: greedy exact match by the `sort` problem set's verifier) on
  the default's held-out sort problems (a metric the loss never sees); called with (params, buffers)."""
  from jaxpod.policy.evaluate import Accuracy
  from jaxpod.problems import SortProblems
  from jaxpod.problems.rewards import VerifiedProblems
  problems = VerifiedProblems(SortProblems(length=sort.length, eval_size=sort.eval_size), ("exact_match",), (), seed)
  longest = max(len(tokenizer.encode(p.prompt)) for p in problems.eval_set())
  options = engine_options(mesh, sort.eval_size, 0.0, longest, sort.length + 2)
  return Accuracy(problems, options, graphdef, mesh, tokenizer, tuple(tokenizer.eos_ids))
