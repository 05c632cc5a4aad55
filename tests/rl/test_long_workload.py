"""`bench rl --against trl`'s long workload gives both sides the same thing: the BPE tokenizer's ids are the same
through jaxpod's loader and transformers', the problems' worked solutions end in the true count, and only the
teacher's rows carry its mistake."""
import dataclasses
import json
import re


def test_long_workload_rows_and_tokenizer_are_the_same_on_both_sides(tmp_path):
  from transformers import AutoTokenizer
  from jaxpod.bench.rl.long import SIZES, build, train_tokenizer
  from jaxpod.models.llama.tokenizer import load_tokenizer
  w = dataclasses.replace(SIZES["small"], problems=30, sft=60, vocab=320)
  paths = build(str(tmp_path / "data"), w)
  problems = [json.loads(line) for line in open(paths["problems"])]
  sft = [json.loads(line) for line in open(paths["sft"])]
  assert not {p["question"] for p in problems} & {r["question"] for r in sft}  # RL prompts are not demonstrated
  for p in problems:  # a correct worked solution: a numbered line per day, each from the one before; the count
    lines = p["answer"].split("\n")
    count, gain, loss, days = map(int, re.search(r"has (\d+) .* (\d) more and \w+(?: away)? (\d)\. .* after (\d+) days",
                                                 p["question"]).groups())
    for i, line in enumerate(lines[:-1]):
      k, a, g, up, up2, op, b, down = re.fullmatch(r"\((\d+)\) (\d+)\+(\d)=(\d+), (\d+)([+-])(\d)=(\d+)", line).groups()
      assert (int(k), int(a), int(g), int(up), int(up2)) == (i + 1, count, gain, count + gain, count + gain)
      assert (op, int(b), int(down)) == ("-", loss, count + gain - loss)
      count = int(down)
    assert lines[-1] == f"#### {count}" and len(lines) - 1 == days and w.steps[0] <= days <= w.steps[1]
  flawed = sum("+" in line.split(", ")[1] for r in sft for line in r["answer"].split("\n")[:-1])
  assert flawed > 0  # only the teacher's rows read a take-away as a sum
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
