"""A group's rewards belong to its own samples, whatever order the engine finished them in."""
from jaxpod.models.llama.tokenizer import ByteTokenizer
from jaxpod.problems import AdditionProblems
from jaxpod.problems.base import Problem
from jaxpod.problems.rewards import VerifiedProblems
from jaxpod.rl.rollout.episodes import group
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
