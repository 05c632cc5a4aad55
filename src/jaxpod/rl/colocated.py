"""Colocated RL: trainer and engine share the devices and alternate, weights handed over in memory.

Step k of the trainer trains on the rollouts of policy version k-1 (the weights after k-1 steps):

    on_start (version s = start)  rollouts of problems for step s+1 with the starting weights
    step s+1                      train on them;  hook after it: rollouts for step s+2 with version s+1 ...

The engine reads the trainer's parameter arrays in place when the trainer's layout is already its
inference layout (no fsdp), else one resharded copy per version (`sample/layout.py`; no recompilation).
Before the first rollout, the train state plus both engines' weights and KV caches are checked against
device memory (`check_memory`): one line naming the knob instead of an out-of-memory error mid-run. Every host runs the same engine calls (global mode)
and takes its own contiguous share of the batch rows.

A batch is filled in rounds: a round samples the next `sample_prompts_per_step` problems of
training stream 2 and `grpo.take` admits groups in order (`grpo.admit`, the rule the disaggregated
trainer applies to the queue: with filter_groups, groups whose rewards are all equal are dropped)
until `num_prompts_per_step` are taken; at most `max_sampling_rounds` rounds per batch (DAPO's
max_num_gen_batches; `grpo.BatchFill`, the bound the disaggregated trainer applies too: a policy that fails
almost every problem ends the run in one line; one that solves them ends it as a success at its last step).
Request seeds are fixed by the run seed, so a rerun from a checkpoint regenerates exactly the rollouts
it would have trained on: the data state is the number of batches trained and the stream position of the batch not yet
trained (invariant 5 for RL: nothing trained twice, nothing lost).

`run.py` builds the `BatchSlot` (the one batch the next step trains on) and hands it to the GRPO task as its batch
source; the slot brings its hook (`ColocatedRollouts`), which fills it with the trainer's weights when the trainer
calls it.
"""
from __future__ import annotations

import time

from jaxpod.policy.engine import EngineOptions
from jaxpod.policy.spec import PolicySpec
from jaxpod.problems.rewards import VerifiedProblems
from jaxpod.rl import grpo
from jaxpod.rl.batch import Batcher, BatchSource
from jaxpod.rl.config import GRPOConfig
from jaxpod.runtime import progress
from jaxpod.runtime.hooks import Hook, StepInfo

RL_STREAM = 2  # training stream of RL problems (the warm-up uses stream 1)


def check_memory(state, mesh, rollout: EngineOptions, model_cfg, available: int | None = None) -> dict[str, int]:
  """The train state, the rollout and evaluation engines' KV caches and their one shared inference-layout weight
  copy, bytes per device, against device memory; a one-line ValueError naming the largest part's knob."""
  from jaxpod.sample.memory import (EngineMemory, check_train_and_engines, engine_knob, engine_weight_bytes,
                                    kv_cache_bytes, tree_bytes_per_device)
  ro, ev = rollout.engine(), rollout.engine(greedy=True)
  copy = 0 if mesh.shape["fsdp"] == 1 else engine_weight_bytes(model_cfg, mesh)  # one copy, both engines read it
  return check_train_and_engines(tree_bytes_per_device(state), [
      EngineMemory("rollout", kv_cache_bytes(model_cfg, ro, mesh), copy, engine_knob("rl.rollout", ro)),
      EngineMemory("eval", kv_cache_bytes(model_cfg, ev, mesh), 0, engine_knob("rl.rollout", ev, "eval_slots"))],
      available=available)


def fill_batch(rounds, fill: grpo.BatchFill) -> list:
  """The groups `fill` admits from `rounds`, an iterator of lists of groups (each drawn only when the previous ones
  did not fill the batch); `grpo.Solved` or `grpo.Starved` once `fill` gives up (max_sampling_rounds rounds)."""
  chosen = []
  for groups in rounds:
    taken, _ = fill.take(groups)
    chosen += [groups[i] for i in taken]
    if fill.full:
      return chosen
    if fill.starved():
      raise fill.give_up()
  raise RuntimeError("rl colocated: the rounds of a batch ran out")  # `rounds` is endless in a run


class BatchSlot(BatchSource):
  """The trainer's iterator: a slot for one batch, the one the next step trains on, filled by `ColocatedRollouts`
  with the latest weights after every step."""

  def __init__(self, problems: VerifiedProblems, policy: PolicySpec, rollout: EngineOptions, grpo_cfg: GRPOConfig,
               batcher: Batcher):
    self.problems, self.rollout, self.batcher = problems, rollout, batcher
    self.lora = policy.lora  # LoRA: the engine samples with the adapters on the trainer's frozen base
    self.tokenizer, self.stop_ids = policy.tokenizer, policy.stop_ids
    g = grpo_cfg
    self.num_generations, self.sampled_prompts = g.num_generations, g.sampled_prompts
    self.grpo = g
    self.trained = 0  # batches handed to the trainer (= optimizer steps taken on rollouts)
    self.ready: dict | None = None  # the global arrays of batch `trained`
    self.ended: grpo.Solved | None = None  # the policy solved its problems: no batch `trained`, the run ends
    self.cursor: int | None = None  # stream position of the next round (None: the start of batch `trained`)
    self.ready_from = 0  # stream position the ready batch's first round sampled

  def __next__(self) -> dict:
    if self.ended is not None:
      raise self.ended  # every host: decided from the same groups (the trainer ends at its last step)
    if self.ready is None:
      raise RuntimeError("colocated rollouts: no batch was generated for the next step (ColocatedRollouts missing?)")
    batch, self.ready = self.ready, None
    self.trained += 1
    return batch

  def get_state(self) -> dict:
    """Batches trained and where the batch not yet trained starts (regenerated on resume)."""
    drawn = self.ready is not None or self.ended is not None  # a batch's rounds were drawn: a rerun draws them again
    return {"trained": self.trained, "cursor": self.ready_from if drawn else self.cursor}

  def set_state(self, state: dict) -> None:
    self.trained = int(state["trained"])
    self.cursor = state.get("cursor")  # absent in checkpoints written before rounds: derived from `trained`

  def hooks(self, graphdef, mesh) -> list:
    return [ColocatedRollouts(self, graphdef, mesh)]

  def weights(self, state):
    """The policy the engine samples with: the params, or with LoRA the adapters on the base (no copy)."""
    from jaxpod.rl.adapters import weights
    return state.params if self.lora is None else weights(state.params, state.buffers)


class ColocatedRollouts(Hook):
  """After every step (and once at the start): sample the next batch with the weights just made."""

  def __init__(self, slot: BatchSlot, graphdef, mesh):
    self.slot, self.graphdef, self.mesh = slot, graphdef, mesh
    self.roller = None
    self.last_end: float | None = None  # when the previous call ended: the span since is the train step and hooks

  def due(self, step: int, final: bool) -> bool:
    return not final

  def on_start(self, info: StepInfo) -> dict:
    from flax import nnx
    model = nnx.merge(self.graphdef, self.slot.weights(info.state))
    check_memory(info.state, self.mesh, self.slot.rollout, model.cfg)
    return self(info)

  def __call__(self, info: StepInfo) -> dict:
    t0 = time.perf_counter()
    interval = t0 - self.last_end if self.last_end is not None else 0.0
    slot = self.slot
    problems = slot.problems
    params, version = slot.weights(info.state), int(info.step)
    if self.roller is None:
      from jaxpod.policy.engine import make_sampler
      from jaxpod.policy.rollout.episodes import samples_for
      from jaxpod.policy.rollout.roller import Roller
      sampler = make_sampler(self.graphdef, params, self.mesh, slot.rollout, slot.stop_ids, version=version)
      self.roller = Roller(sampler, slot.tokenizer, problems.scorer(), slot.num_generations, problems.seed,
                           samples_for(problems, slot.rollout.max_prompt_len, slot.rollout.keep_kv))
    else:
      self.roller.sampler.update_params(params, version)  # in memory; resharded once if the layouts differ
    if slot.cursor is None:
      slot.cursor = slot.trained * slot.sampled_prompts
    slot.ready_from = slot.cursor
    before, sampled = self.roller.tokens, []
    prefilled, distinct = self.roller.prefill_tokens, self.roller.context_tokens

    def rounds():
      while True:
        progress.mark(f"rl rollout for step {version + 1}")  # the watchdog's phase: what a stuck host was doing
        batch = problems.train_problems(RL_STREAM, slot.cursor, slot.sampled_prompts)
        slot.cursor += slot.sampled_prompts
        sampled.extend(self.roller.run(batch))
        yield sampled[-len(batch):]

    fill = slot.grpo.batch_fill(version)
    try:
      chosen = fill_batch(rounds(), fill)
      slot.ready = slot.batcher(chosen)
    except grpo.Solved as e:  # raised to the trainer by the next batch it asks for: this step's hooks finish first
      chosen, slot.ended = [], e
    self.last_end = time.perf_counter()
    dt = self.last_end - t0
    tokens = self.roller.tokens - before
    rewards = [r for grp in sampled for r in grp.rewards]
    return {"rl/rollout_s": dt, "rl/rollout_tok_s": tokens / max(dt, 1e-9), "rl/rollout_tokens": tokens,
            "rl/interval_s": interval, "rl/sampled_version": version, "rl/sampled_reward": sum(rewards) / len(rewards),
            "rl/mixed_groups": sum(grp.mixed for grp in sampled) / len(sampled),
            # the trained episodes that got an observation (a tool answered): what multi-turn training is about
            "rl/observed": (sum(not all(f) for grp in chosen for f in grp.from_policy)
                            / max(sum(g.n for g in chosen), 1)),
            "rl/samples": sum(len(grp.sampled) for grp in sampled),  # samples (episodes) drawn for this batch
            "rl/prefill_tokens": self.roller.prefill_tokens - prefilled,  # real tokens the engine prefilled for them
            "rl/context_tokens": self.roller.context_tokens - distinct,  # their distinct tokens (prompt + after it)
            **{f"rl/dropped_{why}": float(fill.dropped(why)) for why in grpo.DROP_REASONS}}
