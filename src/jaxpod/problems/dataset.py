"""The `dataset` problem set: problems from a prompt file the user brings (JSONL or Parquet, local or a URL).

    jaxpod rl --model.hf DIR --problems.type dataset --problems.path problems.jsonl --rewards '[gsm8k]'
    problems: {type: dataset, path: gs://b/gsm8k.jsonl, prompt_column: question, answer_column: answer,
           prompt_format: "Question: {prompt}\\nAnswer:", verifier: gsm8k}

Rows are read with `jaxpod.data.prompts` (HF `datasets`); the held-out split is the file's own
(`split_held_out`: by prompt hash, or `eval_path`), never trained on. Training stream s walks the
training rows in a fresh seeded order every epoch, so problem i of stream s is a pure function of
(seed, s, i) like the generated sets' (a restart regenerates exactly the rollouts it would have
trained on). Prompts given as chat messages are rendered with the chat template of `chat_template`
(a folder or URL with the tokenizer files; `jaxpod rl` fills in `model.hf` when it is empty).

Every host reads the whole file, not a slice: jaxpod's rollout engine runs in global mode, where
every host submits the same prompts and then keeps its own share of the rows, so each host needs
every prompt of a step (prompt files are megabytes). `read_prompts(..., shard=)` gives a host
its slice where each host consumes different rows. At setup the hosts of each job compare a digest of
the problems they read (`policy.spec.check_same_problems`): a file that differs between hosts' disks is
one line naming the hosts, not a silent divergence.
"""
from __future__ import annotations

import dataclasses
import functools
import string

import numpy as np

from jaxpod.problems import verifiers
from jaxpod.problems.base import EVAL_STREAM, Problem, ProblemSet

VERIFIERS = ("exact_match", "gsm8k", "boxed")


@ProblemSet.register_subclass("dataset")
@dataclasses.dataclass(frozen=True)
class DatasetProblems(ProblemSet):
  """Prompts and reference answers from a file (see the module docstring)."""

  path: str = ""  # the prompt file: .jsonl / .json / .parquet, local path or URL (gs://, s3://)
  prompt_column: str = "prompt"  # column with the prompt: text, or a list of {"role", "content"} messages
  answer_column: str = "answer"  # column with the reference answer (text or number)
  eval_path: str = ""  # a held-out file with the same columns (empty: hold out eval_size prompts of `path` by hash)
  prompt_format: str = "{prompt}"  # how a text prompt is shown to the policy ({prompt} is replaced)
  chat_template: str = ""  # folder/URL whose tokenizer files carry the chat template for message prompts (empty: model.hf)
  verifier: str = "exact_match"  # what counts as correct in held-out accuracy and pass@k: exact_match | gsm8k | boxed

  def __post_init__(self):
    super().__post_init__()
    if not self.path:
      raise ValueError("rl.problems.path is empty; give the prompt file (--problems.path problems.jsonl)")
    fields = {name for _, name, _, _ in string.Formatter().parse(self.prompt_format) if name is not None}
    if fields != {"prompt"}:
      raise ValueError(f"rl.problems.prompt_format={self.prompt_format!r} must contain {{prompt}} and no other field "
                       "(write a literal brace as {{ or }})")
    if self.verifier not in VERIFIERS:
      raise ValueError(f"rl.problems.verifier={self.verifier!r}; use one of {VERIFIERS}")

  @property
  def correct_reward(self) -> str:
    return self.verifier

  def well_formed(self, completion: str) -> bool:
    if self.verifier == "gsm8k":
      return verifiers.gsm8k_answer(completion) is not None
    if self.verifier == "boxed":
      return verifiers.last_boxed(completion) is not None
    return bool(completion)

  def fingerprint(self) -> str:
    return _tables(self).digest

  def max_prompt_chars(self) -> int:
    return max(len(p.prompt) for p in _tables(self).all)

  def max_answer_chars(self) -> int:
    return max(len(p.answer) for p in _tables(self).all)

  def problem(self, seed: int, stream: int, index: int) -> Problem:
    if stream == EVAL_STREAM:
      return self.eval_set(seed)[index]
    train = _tables(self).train
    epoch, i = divmod(index, len(train))
    order = _epoch_order(len(train), seed, stream, epoch)
    p = train[int(order[i])]
    return Problem(p.prompt, p.answer, stream, index)

  def eval_set(self, seed: int) -> list[Problem]:
    """The held-out problems (the same for every seed: the split belongs to the file)."""
    return list(_tables(self).held_out)

  def train_problems(self, seed: int, stream: int, start: int, count: int) -> list[Problem]:
    if stream == EVAL_STREAM:
      raise ValueError(f"stream {EVAL_STREAM} holds the held-out problems; training streams start at 1")
    return [self.problem(seed, stream, i) for i in range(start, start + count)]


@functools.lru_cache(maxsize=64)
def _epoch_order(rows: int, seed: int, stream: int, epoch: int) -> np.ndarray:
  return np.random.default_rng([seed, stream, epoch, 11]).permutation(rows)


@dataclasses.dataclass(frozen=True)
class _Tables:
  held_out: tuple[Problem, ...]  # stream EVAL_STREAM, index = row number in its file
  train: tuple[Problem, ...]  # stream 0 placeholders: `problem()` stamps the stream and index
  all: tuple[Problem, ...]
  digest: str  # sha256 of every rendered prompt and answer, in split order (hosts compare it)


@functools.lru_cache(maxsize=4)
def _tables(problem_set: DatasetProblems) -> _Tables:
  """The file read once per process: rendered held-out and training problems."""
  from jaxpod.data import prompts
  source = prompts.PromptSource(problem_set.path, problem_set.prompt_column, problem_set.answer_column,
                                fields="rl.problems.")
  rows = prompts.read_prompts(source)
  given = None
  if problem_set.eval_path:
    given = prompts.read_prompts(dataclasses.replace(source, path=problem_set.eval_path))
  held_out, train = prompts.split_held_out(rows, problem_set.eval_size, given)
  template, specials = _chat_template(problem_set, rows + (given or []))

  def render(r, path):
    text = prompts.render_prompt(r.prompt, problem_set.prompt_format, template, specials, f"{path} row {r.row}")
    return Problem(text, r.answer, EVAL_STREAM, r.row)

  held = tuple(render(r, problem_set.eval_path or problem_set.path) for r in held_out)
  trained = tuple(render(r, problem_set.path) for r in train)
  import hashlib
  digest = hashlib.sha256()
  for part in (held, trained):
    digest.update(f"{len(part)}\n".encode())
    for p in part:
      digest.update(f"{len(p.prompt)}:{p.prompt}{len(p.answer)}:{p.answer}".encode())
  return _Tables(held, trained, held + trained, digest.hexdigest())


def _chat_template(problem_set: DatasetProblems, rows) -> tuple[str | None, dict]:
  """The chat template and special tokens, read only when some prompt is a message list."""
  if all(isinstance(r.prompt, str) for r in rows):
    return None, {}
  if not problem_set.chat_template:
    return None, {}  # render_prompt names the row and the field
  from jaxpod.data.chat import load_chat_template, load_special_tokens
  return load_chat_template(problem_set.chat_template), load_special_tokens(problem_set.chat_template)
