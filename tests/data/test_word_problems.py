"""`jaxpod data word-problems`: GSM8K-format arithmetic word problems, a warm-up set that never repeats an RL
question, and a teacher whose only mistakes are its habits (a take-away read as a sum, a dropped carry)."""
import json

from jaxpod.data.word_problems import WordProblemConfig, build
from jaxpod.problems.verifiers import gsm8k_correct


def _read(path) -> list[dict]:
  return [json.loads(line) for line in open(path)]


def test_rows_are_gsm8k_format_and_the_rl_answers_verify(tmp_path):
  build(WordProblemConfig(out=str(tmp_path), problems=200, sft=0))
  rows = _read(tmp_path / "problems.jsonl")
  assert len(rows) == 200 and all(r["answer"].count("\n#### ") == 1 for r in rows)
  for r in rows:
    work = r["answer"].split("\n")[0]
    expression, result = work.split("=")
    assert gsm8k_correct(r["answer"], str(eval(expression)))  # test-only eval of "37+45" written by the generator


def test_the_warm_up_teacher_reads_take_away_as_a_sum_at_its_rate_and_is_otherwise_right(tmp_path):
  build(WordProblemConfig(out=str(tmp_path), problems=100, sft=2000, teacher_wrong_op=0.7))
  sft = _read(tmp_path / "sft.jsonl")
  take_away = [r for r in sft if "left?" in r["question"]]
  misread = [r for r in take_away if "+" in r["answer"]]
  assert 0.65 < len(misread) / len(take_away) < 0.75
  for r in sft:
    expression, result = r["answer"].split("\n")[0].split("=")
    numbers = [int(x) for x in r["question"].replace(".", " ").replace("?", " ").split() if x.isdigit()]
    assert [int(x) for x in expression.replace("-", "+").split("+")] == numbers  # the question's numbers, in order
    assert int(result) == eval(expression) and r["answer"].endswith(f"#### {result}")


def test_the_warm_up_set_holds_other_questions_and_slips_only_on_carries(tmp_path):
  build(WordProblemConfig(out=str(tmp_path), problems=300, sft=600, digits=2, teacher_wrong_op=0.0,
                          teacher_carry_slip=1.0))
  rl, sft = _read(tmp_path / "problems.jsonl"), _read(tmp_path / "sft.jsonl")
  assert not {r["question"] for r in rl} & {r["question"] for r in sft}
  for r in sft:
    expression, result = r["answer"].split("\n")[0].split("=")
    a, b = (int(x) for x in expression.replace("-", "+").split("+"))
    no_carry = "-" in expression or all(int(x) + int(y) < 10 for x, y in zip(str(a)[::-1], str(b)[::-1]))
    assert len(str(b)) == 1 or "-" in expression  # --second_digits 1: a one-digit number is added
    assert (int(result) == eval(expression)) == no_carry, r


def test_the_same_seed_writes_the_same_files(tmp_path):
  for name in ("a", "b"):
    build(WordProblemConfig(out=str(tmp_path / name), problems=50, sft=50, seed=3))
  assert (tmp_path / "a" / "sft.jsonl").read_text() == (tmp_path / "b" / "sft.jsonl").read_text()
