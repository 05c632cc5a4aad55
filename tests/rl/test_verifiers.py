"""Answer verifiers accept the reference answer however a model writes it, and nothing else."""
import threading

import pytest

from jaxpod.problems.verifiers import boxed_correct, gsm8k_answer, gsm8k_correct, last_boxed, normalise


@pytest.mark.parametrize("completion", [
    "She has 3 boxes of 411 apples, 1233 + 1 = 1234.\n#### 1234",
    "#### 1,234",            # thousands separator
    "#### $1,234.00",        # currency and cents
    "#### 1234 apples.",     # unit and trailing period
    "Answer:\n####   1234  \n",
    "first guess #### 12\nno wait\n#### 1234",  # the last mark counts
])
def test_gsm8k_accepts_the_answer_however_written(completion):
  assert gsm8k_correct(completion, "1234")


@pytest.mark.parametrize("completion", [
    "The answer is 1234.",     # no #### mark: the format is part of the task
    "#### 1243",
    "#### 1234\n#### 12",      # the last mark counts
    "####",
    "#### twelve hundred",
])
def test_gsm8k_rejects_wrong_or_missing_answers(completion):
  assert not gsm8k_correct(completion, "1234")


def test_gsm8k_reference_may_carry_its_own_mark_and_be_negative_or_decimal():
  assert gsm8k_correct("#### -3.5", "Step... #### -3.50")
  assert gsm8k_correct("#### 0.5", "1/2")
  assert not gsm8k_correct("#### 3.5", "-3.5")


def test_gsm8k_answer_is_the_first_line_after_the_last_mark():
  assert gsm8k_answer("x #### 5\ny #### 7 dollars\nthanks") == "7 dollars"
  assert gsm8k_answer("no mark") is None


@pytest.mark.parametrize("completion,reference", [
    (r"so the result is \boxed{\frac{\sqrt{2}}{2}}.", r"\frac{1}{\sqrt{2}}"),
    (r"\boxed{\dfrac{3}{4}}", "0.75"),
    (r"\boxed{1,234}", "1234"),
    (r"\boxed{5\text{ cm}}", "5"),
    (r"\boxed{x^{2}+1}", "x^2+1"),
    (r"\boxed{\{1,2\}}", r"\{1,2\}"),
    (r"$\boxed{\text{(B)}}$", "B"),                  # a choice: normalised string
    (r"\boxed{\textbf{Paris}}.", "paris"),
    (r"first \boxed{3}, finally \boxed{4}", "4"),     # the last box counts
    (r"\fbox{42}", "42"),
])
def test_boxed_accepts_equal_values_and_normalised_strings(completion, reference):
  assert boxed_correct(completion, reference)


@pytest.mark.parametrize("completion,reference", [
    (r"\boxed{0.333}", r"\frac{1}{3}"),   # not equal, only close
    (r"the answer is 4", "4"),            # no box: the format is part of the task
    (r"\boxed{4", "4"),                   # unclosed: stopped mid-answer
    (r"\boxed{}", ""),
    (r"\boxed{(C)}", "B"),
    (r"\boxed{x^{2}-1}", "x^2+1"),
])
def test_boxed_rejects_other_values_missing_or_unclosed_boxes(completion, reference):
  assert not boxed_correct(completion, reference)


def test_last_boxed_keeps_nested_braces():
  assert last_boxed(r"a \boxed{\frac{a}{b_{1}}} b") == r"\frac{a}{b_{1}}"
  assert last_boxed("none") is None


def test_normalise_strips_wrappers_spaces_and_case():
  assert normalise(r"$\text{ New\ York }$.") == "newyork"


def test_verifiers_work_off_the_main_thread():
  # math-verify's default timeouts use SIGALRM, which only the main thread may set.
  out = []
  t = threading.Thread(target=lambda: out.append((gsm8k_correct("#### 7", "7"), boxed_correct(r"\boxed{7}", "7"))))
  t.start()
  t.join()
  assert out == [(True, True)]


@pytest.mark.parametrize("name,completion", [("gsm8k", "so 12.\n#### 12"), ("boxed", r"so \boxed{12}.")])
def test_verifier_rewards_score_only_stopped_samples(name, completion):
  from jaxpod.problems.rewards import resolve
  from jaxpod.problems import AdditionProblems, Problem
  reward = resolve(name, AdditionProblems())
  problem = Problem(prompt="5+7=", answer="12")
  assert reward(problem, completion, True) == 1.0
  assert reward(problem, completion, False) == 0.0  # cut by the length limit: not an answer
  assert reward(problem, completion.replace("12", "13"), True) == 0.0


def test_a_completion_scored_twice_is_parsed_once():
  """A rollout asks the verifier twice per completion (its reward, then `correct`): the second answer comes from the
  memo, and the n samples of one problem share its parsed reference."""
  from jaxpod.problems import verifiers
  completion, reference = "so 17 + 25 = 42\n#### 42 (memo test)", "#### 42"
  before = gsm8k_correct.cache_info()
  assert gsm8k_correct(completion, reference) and gsm8k_correct(completion, reference)
  after = gsm8k_correct.cache_info()
  assert (after.misses - before.misses, after.hits - before.hits) == (1, 1)
  gold_before = verifiers._gold.cache_info().hits
  gsm8k_correct("#### 42.0 (another sample)", reference)
  assert verifiers._gold.cache_info().hits > gold_before
