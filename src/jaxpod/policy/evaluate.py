"""The held-out evaluator of a policy (`Accuracy`): greedy accuracy on the problem set's held-out problems, and pass@k.

    evaluate = Accuracy(problems, options, graphdef, mesh, policy.tokenizer, policy.stop_ids)
    evaluate(params, buffers)    # {"accuracy", "count", "seconds"} (+ "pass_at_1", "pass_at_K" with eval.k)

The one held-out evaluator: `jaxpod rl`'s warm-up and GRPO runs and the preference default use it.
"""
from __future__ import annotations

from typing import Callable

from jaxpod.policy.engine import EngineOptions
from jaxpod.problems.rewards import VerifiedProblems


class Accuracy:
  """Greedy accuracy on the held-out problems, and pass@k with `eval.k` (the trainer's evaluator); for a multi-turn
  set, the fraction of episodes solved."""

  def __init__(self, problems: VerifiedProblems, options: EngineOptions, graphdef, mesh, tokenizer, stop_ids,
               weights: Callable | None = None):
    from jaxpod.policy.rollout.episodes import samples_for
    self.weights = weights  # (params, buffers) -> the whole policy's state (LoRA: adapters + base); None: params
    self.options, self.graphdef, self.mesh, self.tokenizer, self.stop_ids = options, graphdef, mesh, tokenizer, stop_ids
    self.problems = problems.eval_set()
    self.evaluation, self.seed = problems.evaluation, problems.seed
    self.samples = samples_for(problems, options.max_prompt_len, options.keep_kv)  # one turn, or episodes
    self.sampler = None
    self.sampling = None  # pass@k: the rollout engine's shapes and temperature (its programs are the rollouts')

  def __call__(self, params, buffers) -> dict:
    import time
    from jaxpod.policy.engine import make_sampler
    from jaxpod.policy.rollout.roller import accuracy, pass_at_k
    t0 = time.perf_counter()
    if self.weights is not None:
      params = self.weights(params, buffers)
    if self.sampler is None:
      self.sampler = make_sampler(self.graphdef, params, self.mesh, self.options, self.stop_ids, greedy=True)
    else:
      self.sampler.update_params(params, self.sampler.version + 1)
    out = accuracy(self.sampler, self.tokenizer, self.problems, self.samples)
    ev = self.evaluation
    if ev.k:
      if self.sampling is None:
        self.sampling = make_sampler(self.graphdef, params, self.mesh, self.options, self.stop_ids)
      else:
        self.sampling.update_params(params, self.sampling.version + 1)
      out |= pass_at_k(self.sampling, self.tokenizer, self.problems, ev.n, ev.k, self.seed, self.samples)
    return out | {"seconds": time.perf_counter() - t0}
