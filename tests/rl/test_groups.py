"""Groups and the batch built from them: a group's rewards stay with its own samples; rows end where the batch does."""
import numpy as np

from jaxpod.models.llama.tokenizer import ByteTokenizer
from jaxpod.problems import AdditionProblems
from jaxpod.problems.base import Problem
from jaxpod.problems.rewards import VerifiedProblems
from jaxpod.policy.rollout.episodes import group
from jaxpod.policy.rollout.groups import Group
from jaxpod.rl.batch import Batcher
from jaxpod.sample.tokens import Completion

TOK = ByteTokenizer(add_bos=False)  # completions carry no BOS


def _completion(text: str, sample: int, stop: int) -> Completion:
  sampled = (*TOK.encode(text), stop)
  return Completion(sampled, "stop", (-0.5,) * len(sampled), (0,) * len(sampled), request=7, sample=sample)


def test_rewards_stay_with_their_samples_when_samples_finish_out_of_order():
  """The continuous engine hands samples back as they finish (a 2-host worker: one data shard's after the
  other's), so a group's completions arrive out of sample order; each reward must be its own text's, or GRPO
  credits the wrong samples (the 2-host disaggregated run that did not learn)."""
  scorer = VerifiedProblems(AdditionProblems(digits=1), ("exact_match",), (), 0).scorer()
  problem = Problem(prompt="2+2=", answer="4", stream=0, index=0)
  texts = ["5", "4", "44", "4", "3"]
  arrived = [_completion(texts[j], j, stop=TOK.eos_ids[0]) for j in (3, 0, 4, 1, 2)]  # finishing order
  g = group(scorer, TOK, problem, TOK.encode(problem.prompt), arrived)
  assert [TOK.decode(s[:-1]) for s in g.sampled] == texts  # sample order
  assert g.rewards == [0.0, 1.0, 0.0, 1.0, 0.0] and g.correct == [False, True, False, True, False]
  assert g.finished == [True] * 5


def _random_groups(rng, lengths) -> list:
  """One group per entry (prompt tokens, (sample tokens, ...)) of `lengths`, random ids, rewards 0, 1, ..."""
  out = []
  for i, (p, sizes) in enumerate(lengths):
    sampled = [rng.integers(1, 61, s).tolist() for s in sizes]
    out.append(Group(problem=Problem(prompt=f"q{i}", answer="", stream=0, index=i),
                     prompt_ids=rng.integers(1, 61, p).tolist(), sampled=sampled,
                     logprobs=[(-rng.random(s)).tolist() for s in sizes], versions=[[0] * s for s in sizes],
                     finished=[True] * len(sizes), rewards=[float(j) for j in range(len(sizes))],
                     correct=[False] * len(sizes)))
  return out


def test_a_batch_trains_at_the_shortest_length_bucket_that_holds_its_longest_row():
  """grpo.trim_rows: a batch whose rows stop well before max_prompt_len + max_new_tokens trains on its real length
  (bucketed: 32, 48, 64, then the maximum; no shorter than 32), the rows cut from the full-length batch and nothing
  cut away."""
  groups = _random_groups(np.random.default_rng(0), [(9, (3, 20)), (14, (1, 5))])  # longest row: 9 + 20 = 29
  full = Batcher(row_len=76, pad_id=0, scale_rewards="group").global_batch(groups)
  trimmed = Batcher(row_len=76, pad_id=0, scale_rewards="group", trim=True).global_batch(groups)
  assert full["tokens"].shape == (4, 76) and trimmed["tokens"].shape == (4, 32)
  for k, v in full.items():
    np.testing.assert_array_equal(trimmed[k], v[:, :32] if v.ndim == 2 else v)
    if v.ndim == 2:
      assert not v[:, 32:].any()  # only padding (pad id 0, no loss, no log-prob) was cut
  lengths = {b: Batcher(row_len=76, pad_id=0, scale_rewards="group", trim=True).length(
    _random_groups(np.random.default_rng(1), [(5, (b - 5, 1))])) for b in (16, 17, 33, 48, 49, 65, 76)}
  assert lengths == {16: 32, 17: 32, 33: 48, 48: 48, 49: 64, 65: 76, 76: 76}
  short = _random_groups(np.random.default_rng(1), [(5, (3, 1))])
  assert Batcher(row_len=24, pad_id=0, scale_rewards="group", trim=True).length(short) == 24  # rows <= 32: one program
