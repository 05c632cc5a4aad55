"""Colocated RL: trainer and engine share the devices and alternate, weights handed over in memory.

Step k of the trainer trains on the rollouts of policy version k-1 (the weights after k-1 steps):

    on_start (version s = start)  rollouts of problems for step s+1 with the starting weights
    step s+1                      train on them;  hook after it: rollouts for step s+2 with version s+1 ...

The engine reads the trainer's parameter arrays in place (`Sampler.update_params`: same shapes
and shardings, no copy, no recompilation). Every host runs the same engine calls (global mode)
and takes its own contiguous share of the batch rows. The problems of step k are problems
(k-1)*P..k*P-1 of training stream 2 and their request seeds are fixed by the run seed, so a
rerun from a checkpoint regenerates exactly the rollouts it would have trained on: the data
state is just the number of batches trained (invariant 5 for RL: nothing trained twice, nothing lost).
With `grpo.filter_groups`, `sample_prompts_per_step` prompts are sampled and the groups whose rewards
differ are trained on first (DAPO's dynamic sampling: equal rewards give zero advantage).
"""
from __future__ import annotations

import time

from jaxpod.rl.rollouts import select
from jaxpod.runtime.hooks import Hook, StepInfo

RL_STREAM = 2  # training stream of RL problems (the warm-up uses stream 1)


class RolloutBuffer:
  """The trainer's iterator: the next batch, put there by `ColocatedRollouts` with the latest weights."""

  def __init__(self, task):
    self.task = task
    self.trained = 0  # batches handed to the trainer (= optimizer steps taken on rollouts)
    self.ready: dict | None = None  # the global arrays of batch `trained`

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    if self.ready is None:
      raise RuntimeError("colocated rollouts: no batch was generated for the next step (ColocatedRollouts missing?)")
    batch, self.ready = self.ready, None
    self.trained += 1
    return self.task._local(batch)

  def get_state(self) -> dict:
    return {"trained": self.trained}

  def set_state(self, state: dict) -> None:
    self.trained = int(state["trained"])

  def hooks(self, graphdef, mesh) -> list:
    return [ColocatedRollouts(self, graphdef, mesh)]


class ColocatedRollouts(Hook):
  """After every step (and once at the start): sample the next batch with the weights just made."""

  def __init__(self, buffer: RolloutBuffer, graphdef, mesh):
    self.buffer, self.graphdef, self.mesh = buffer, graphdef, mesh
    self.roller = None
    self.last_end: float | None = None  # when the previous call ended: the span since is the train step and hooks

  def due(self, step: int, final: bool) -> bool:
    return not final

  def on_start(self, info: StepInfo) -> dict:
    return self(info)

  def __call__(self, info: StepInfo) -> dict:
    t0 = time.perf_counter()
    interval = t0 - self.last_end if self.last_end is not None else 0.0
    task, rl = self.buffer.task, self.buffer.task.rl
    params, version = info.state.params, int(info.step)
    if self.roller is None:
      from jaxpod.rl.rewards import Scorer
      from jaxpod.rl.sampling import Roller, make_sampler
      sampler = make_sampler(self.graphdef, params, self.mesh, rl.rollout, task.stop_ids, version=version)
      self.roller = Roller(sampler, task.tokenizer, Scorer(rl.rewards, rl.reward_weights, rl.task),
                           rl.grpo.num_generations, rl.trainer.seed)
    else:
      self.roller.sampler.update_params(params, version)  # in memory, no copy
    g = rl.grpo
    problems = rl.task.train_problems(rl.trainer.seed, RL_STREAM, self.buffer.trained * g.sampled_prompts,
                                      g.sampled_prompts)
    before = self.roller.tokens
    groups = self.roller.run(problems)
    chosen = select(groups, g.num_prompts_per_step, g.filter_groups)
    self.buffer.ready = task.batch_arrays(chosen)
    self.last_end = time.perf_counter()
    dt = self.last_end - t0
    tokens = self.roller.tokens - before
    rewards = [r for grp in groups for r in grp.rewards]
    return {"rl/rollout_s": dt, "rl/rollout_tok_s": tokens / max(dt, 1e-9), "rl/rollout_tokens": tokens,
            "rl/interval_s": interval, "rl/sampled_version": version, "rl/sampled_reward": sum(rewards) / len(rewards),
            "rl/mixed_groups": sum(grp.mixed for grp in groups) / len(groups)}
