"""`bench rl --against trl`'s long workload gives both sides the same thing: the BPE tokenizer's ids are the same
through jaxpod's loader and transformers', the problems' worked solutions end in the true count, and only the
teacher's rows carry its mistake."""
import dataclasses
import json
import re


def test_long_workload_rows_and_tokenizer_are_the_same_on_both_sides(tmp_path):
  from transformers import AutoTokenizer
  from jaxpod.bench.rl_long import SIZES, build, train_tokenizer
  from jaxpod.models.llama.tokenizer import load_tokenizer
  w = dataclasses.replace(SIZES["small"], problems=30, sft=60, vocab=320)
  paths = build(str(tmp_path / "data"), w)
  problems = [json.loads(line) for line in open(paths["problems"])]
  sft = [json.loads(line) for line in open(paths["sft"])]
  assert not {p["question"] for p in problems} & {r["question"] for r in sft}  # RL prompts are not demonstrated
  for p in problems:  # a correct worked solution: every line follows from the one before, the answer is the count
    lines = p["answer"].split("\n")
    count = int(re.search(r"has (\d+)", p["question"]).group(1))
    for line in lines[:-1]:
      a, op, b, c = re.fullmatch(r"(?:add|take) \d: (\d+)([+-])(\d)=(\d+)", line).groups()
      assert int(a) == count and int(c) == (count + int(b) if op == "+" else count - int(b))
      count = int(c)
    assert lines[-1] == f"#### {count}" and w.steps[0] <= len(lines) - 1 <= w.steps[1]
  train_tokenizer(paths["sft"], str(tmp_path / "tok"), w.vocab)
  ours, theirs = load_tokenizer(str(tmp_path / "tok")), AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
  for p in problems[:5]:
    ids = ours.encode(p["question"])
    assert ids == theirs(p["question"])["input_ids"] and ids[0] == ours.bos_id
    answer = ours.encode(p["answer"], add_special_tokens=False)
    assert answer == theirs(p["answer"], add_special_tokens=False)["input_ids"]
    assert ours.decode(ids) == p["question"]
  assert (theirs.eos_token_id, theirs.pad_token_id) == (ours.eos_ids[0], ours.pad_id)
  answer = ours.encode(problems[0]["answer"], add_special_tokens=False)
  assert len(answer) < len(problems[0]["answer"])  # merges learned: fewer ids than bytes
