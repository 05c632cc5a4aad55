"""Small arithmetic word problems in GSM8K's format, for RL demonstrations on a prompt file.

    jaxpod data word-problems --out data/wp          # problems.jsonl (RL) + sft.jsonl (the warm-up's teacher)

Each row is {"question": ..., "answer": "<work>\\n#### <number>"}, as GSM8K's are:

    Ann has 7 pens and gets 5 more. How many now?      ->  7+5=12\\n#### 12
    Bo had 9 cards and lost 3. How many left?          ->  9-3=6\\n#### 6

`sft.jsonl` holds other questions (no prompt of problems.jsonl is in it) answered by a flawed
teacher: it misreads a take-away problem as a sum with probability `teacher_wrong_op` (the classic
keyword mistake: "Bo had 9 cards and lost 3" -> 9+3=12) and forgets each carry of a sum with
probability `teacher_carry_slip`. A policy fine-tuned on it copies the habit, and RL with the gsm8k
verifier has something to unlearn (as the built-in tasks' flawed teachers, in a prompt file). The
default numbers are one digit each, so that the small byte-level policy learns the arithmetic
itself in a minute of warm-up and only the habit is left (with `--digits 2` it needs ~5x longer).
Rows are a pure function of the seed.
"""
from __future__ import annotations

import dataclasses
import json

import numpy as np

NAMES = ("Ann", "Bo", "Cy", "Di", "Ed", "Flo")
THINGS = ("pens", "cards", "apples", "coins", "shells", "books")
MORE = ("gets {b} more", "buys {b} more", "finds {b} more")
LESS = ("gave away {b}", "lost {b}", "sold {b}")


@dataclasses.dataclass(frozen=True)
class WordProblemConfig:
  """What `jaxpod data word-problems` writes."""

  out: str = ""  # folder (local or URL) for problems.jsonl and sft.jsonl
  problems: int = 2000  # rows of problems.jsonl (RL prompts; the held-out split is taken from them)
  sft: int = 4000  # rows of sft.jsonl (the warm-up's demonstrations, other questions)
  digits: int = 1  # digits of the first number
  second_digits: int = 1  # digits of the number added or taken away (fewer: a small policy learns it in minutes)
  teacher_wrong_op: float = 0.7  # sft.jsonl's teacher adds instead of taking away with this probability
  teacher_carry_slip: float = 0.0  # sft.jsonl's teacher drops each carry of a sum with this probability
  seed: int = 0

  def __post_init__(self):
    if not self.out:
      raise ValueError("--out is required: the folder to write problems.jsonl and sft.jsonl to")
    if self.problems < 1 or self.sft < 0 or not 1 <= self.second_digits <= self.digits <= 6:
      raise ValueError(f"--problems={self.problems} must be >= 1, --sft={self.sft} >= 0, 1 <= --second_digits="
                       f"{self.second_digits} <= --digits={self.digits} <= 6")
    for name in ("teacher_wrong_op", "teacher_carry_slip"):
      if not 0.0 <= getattr(self, name) <= 1.0:
        raise ValueError(f"--{name}={getattr(self, name)} must be in [0, 1]")


def word_problem(rng: np.random.Generator, digits: int, second_digits: int) -> tuple[str, int, str, int]:
  """(question, a, op, b) of one random problem; a - b is never negative."""
  name = NAMES[rng.integers(len(NAMES))]
  thing = THINGS[rng.integers(len(THINGS))]
  a = int(rng.integers(10 ** (digits - 1), 10 ** digits))
  b = int(rng.integers(10 ** (second_digits - 1) if second_digits > 1 else 1, 10 ** second_digits))
  if rng.random() < 0.5:
    verb = MORE[rng.integers(len(MORE))].format(b=b)
    return f"{name} has {a} {thing} and {verb}. How many now?", a, "+", b
  a, b = max(a, b), min(a, b)
  verb = LESS[rng.integers(len(LESS))].format(b=b)
  return f"{name} had {a} {thing} and {verb}. How many left?", a, "-", b


def solution(a: int, op: str, b: int, result: int) -> str:
  """GSM8K's answer text: the work, then `#### <number>`."""
  return f"{a}{op}{b}={result}\n#### {result}"


def sum_with_slips(a: int, b: int, slip: float, rng: np.random.Generator) -> int:
  """a + b column by column, each carry dropped with probability `slip` (a flawed teacher's sum)."""
  out, carry, place = 0, 0, 1
  while a or b or carry:
    column = a % 10 + b % 10 + carry
    out += column % 10 * place
    carry = column // 10 if rng.random() >= slip else 0
    a, b, place = a // 10, b // 10, place * 10
  return out


def teacher_work(a: int, op: str, b: int, cfg: WordProblemConfig, rng: np.random.Generator) -> tuple[str, int]:
  """The flawed teacher's operation and result: a take-away read as a sum with probability teacher_wrong_op;
  a sum drops each carry with probability teacher_carry_slip."""
  if op == "-" and rng.random() < cfg.teacher_wrong_op:
    op = "+"
  return op, (a - b if op == "-" else sum_with_slips(a, b, cfg.teacher_carry_slip, rng))


def build(cfg: WordProblemConfig) -> dict[str, int]:
  """Write `problems.jsonl` and `sft.jsonl` into cfg.out; returns their row counts."""
  from jaxpod.runtime import storage
  rng = np.random.default_rng([cfg.seed, 28])
  seen: set[str] = set()
  rows: dict[str, list[str]] = {"problems": [], "sft": []}
  for split, count in (("problems", cfg.problems), ("sft", cfg.sft)):
    tries = 0
    while len(rows[split]) < count:
      question, a, op, b = word_problem(rng, cfg.digits, cfg.second_digits)
      tries += 1
      if tries > 50 * (count + 1):
        raise ValueError(f"only {len(rows[split])} distinct {split} questions with --digits={cfg.digits}, "
                         f"--second_digits={cfg.second_digits}; lower the counts or raise the digits")
      if question in seen:  # distinct questions: sft.jsonl never holds a problem RL is evaluated on
        continue
      seen.add(question)
      if split == "problems":
        shown, result = op, (a + b if op == "+" else a - b)
      else:
        shown, result = teacher_work(a, op, b, cfg, rng)
      rows[split].append(json.dumps({"question": question, "answer": solution(a, shown, b, result)}))
  storage.makedirs(cfg.out)
  for split, lines in rows.items():
    storage.write_text(storage.join(cfg.out, f"{split}.jsonl"), "".join(line + "\n" for line in lines))
  return {split: len(lines) for split, lines in rows.items()}
