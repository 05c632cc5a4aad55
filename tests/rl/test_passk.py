"""pass@k equals the exact any-correct probability over every k-subset of the n samples."""
import itertools

import pytest

from jaxpod.problems.passk import mean_pass_at_k, pass_at_k


@pytest.mark.parametrize("n,c,k", [(n, c, k) for n in (1, 4, 7) for c in range(n + 1) for k in range(1, n + 1)])
def test_pass_at_k_equals_enumeration_of_k_subsets(n, c, k):
  samples = [True] * c + [False] * (n - c)
  subsets = list(itertools.combinations(samples, k))
  exact = sum(any(s) for s in subsets) / len(subsets)
  assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)


def test_pass_at_1_is_the_fraction_correct_and_large_n_does_not_overflow():
  assert pass_at_k(1000, 250, 1) == pytest.approx(0.25)
  assert 0.0 < pass_at_k(10_000, 3, 64) < 1.0


def test_mean_over_problems():
  assert mean_pass_at_k([(4, 0), (4, 4), (4, 2)], k=1) == pytest.approx((0 + 1 + 0.5) / 3)


@pytest.mark.parametrize("n,c,k,field", [(4, 5, 1, "c=5"), (4, 1, 5, "k=5"), (4, 1, 0, "k=0")])
def test_impossible_counts_are_refused_by_name(n, c, k, field):
  with pytest.raises(ValueError, match=field):
    pass_at_k(n, c, k)
