"""pass@k: the chance that at least one of k samples is correct, estimated without bias from n >= k.

Chen et al. 2021 (Codex): with n samples of which c are correct, pass@k = 1 - C(n-c, k) / C(n, k),
the probability that a random k-subset of the n holds a correct one. Computed as a running
product so that large n never overflows. Drawing exactly k samples and checking any-correct is
the same in expectation but much noisier; the estimator uses all n. `EvalConfig` is the `eval` section of
`jaxpod rl` (how many samples per held-out problem, which k).
"""
from __future__ import annotations

import dataclasses
from typing import Iterable


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  """Held-out evaluation beside greedy accuracy: pass@k from `samples` samples per problem at the rollout temperature."""

  k: int = 0  # pass@k on the held-out split, with pass@1 (0: greedy accuracy only)
  samples: int = 0  # samples per held-out problem, n >= k (0: k); the unbiased estimator uses all n

  def __post_init__(self):
    if self.k < 0 or self.samples < 0:
      raise ValueError(f"rl.eval: k={self.k} and samples={self.samples} must be >= 0")
    if self.samples and self.samples < self.k:
      raise ValueError(f"rl.eval.samples={self.samples} is below eval.k={self.k}; pass@k needs n >= k samples per "
                       "problem")
    if self.samples and not self.k:
      raise ValueError(f"rl.eval.samples={self.samples} without eval.k; set --eval.k (e.g. 4)")

  @property
  def n(self) -> int:
    """Samples drawn per held-out problem."""
    return self.samples or self.k


def pass_at_k(n: int, c: int, k: int) -> float:
  """Unbiased pass@k of one problem with `c` correct out of `n` samples (needs 1 <= k <= n)."""
  if not 0 <= c <= n:
    raise ValueError(f"pass_at_k: correct count c={c} must be within 0..n={n}")
  if not 1 <= k <= n:
    raise ValueError(f"pass_at_k: k={k} must be within 1..n={n} (draw at least k samples per problem: eval.samples)")
  if n - c < k:
    return 1.0
  miss = 1.0  # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k/i)
  for i in range(n - c + 1, n + 1):
    miss *= 1.0 - k / i
  return 1.0 - miss


def mean_pass_at_k(counts: Iterable[tuple[int, int]], k: int) -> float:
  """pass@k averaged over problems, each given as (n samples, c correct)."""
  values = [pass_at_k(n, c, k) for n, c in counts]
  if not values:
    raise ValueError("mean_pass_at_k: no problems to average over")
  return sum(values) / len(values)
