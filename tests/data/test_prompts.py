"""Prompt files users bring: read by HF `datasets` (JSONL, Parquet, local or gs://), checked row by row,
split into a held-out set that belongs to the file, sliced per host."""
import json
import pathlib

import pytest

from jaxpod.data.prompts import (PromptDataError, PromptSource, read_prompts, render_prompt, slice_bounds,
                                 split_held_out)

TEMPLATES = pathlib.Path(__file__).parent / "chat_templates"


def _write_jsonl(path, records) -> str:
  path.write_text("".join(json.dumps(r) + "\n" for r in records))
  return str(path)


def _problems(n: int) -> list[dict]:
  return [{"question": f"What is {i}+{i}?", "answer": f"{i}+{i}={2 * i}\n#### {2 * i}"} for i in range(n)]


def test_jsonl_rows_keep_their_row_numbers_and_numeric_answers_become_text(tmp_path):
  path = _write_jsonl(tmp_path / "p.jsonl", [{"q": "2+2?", "a": 4}, {"q": "half of 3?", "a": 1.5}, {"q": "x", "a": "y"}])
  rows = read_prompts(PromptSource(path, "q", "a"))
  assert [(r.row, r.prompt, r.answer) for r in rows] == [(0, "2+2?", "4"), (1, "half of 3?", "1.5"), (2, "x", "y")]


def test_parquet_reads_the_same_rows_as_jsonl(tmp_path):
  import pyarrow as pa
  import pyarrow.parquet as pq
  records = _problems(5)
  pq.write_table(pa.Table.from_pylist(records), tmp_path / "p.parquet")
  jsonl = read_prompts(PromptSource(_write_jsonl(tmp_path / "p.jsonl", records), "question"))
  assert read_prompts(PromptSource(str(tmp_path / "p.parquet"), "question")) == jsonl


def test_a_file_in_a_bucket_reads_like_a_local_one(tmp_path, bucket):
  from jaxpod.runtime import storage
  local = _write_jsonl(tmp_path / "p.jsonl", _problems(4))
  storage.write_text(f"{bucket}/data/p.jsonl", pathlib.Path(local).read_text())
  assert read_prompts(PromptSource(f"{bucket}/data/p.jsonl", "question")) == read_prompts(PromptSource(local, "question"))


def test_a_missing_column_names_the_columns_there_and_the_field(tmp_path):
  path = _write_jsonl(tmp_path / "p.jsonl", _problems(2))
  with pytest.raises(PromptDataError, match=r"no column 'prompt' \(it has question, answer\); set prompt_column"):
    read_prompts(PromptSource(path))


@pytest.mark.parametrize("bad, message", [({"question": "", "answer": "1"}, "row 2 column 'question': the prompt is empty"),
                                          ({"question": "q", "answer": None}, "row 2 column 'answer': the answer is None"),
                                          ({"question": [{"content": "no role"}], "answer": "1"},
                                           "row 2 column 'question': the prompt is")])
def test_a_bad_row_is_named_by_its_row_number(tmp_path, bad, message):
  path = _write_jsonl(tmp_path / "p.jsonl", _problems(2) + [bad] + _problems(1))
  with pytest.raises(PromptDataError, match=message):
    read_prompts(PromptSource(path, "question"))


def test_an_unknown_file_type_and_a_missing_file_fail_in_one_line(tmp_path):
  with pytest.raises(PromptDataError, match=r"unknown prompt file type; use one of \.jsonl, \.json, \.parquet"):
    read_prompts(PromptSource(str(tmp_path / "p.csv")))
  with pytest.raises(PromptDataError, match="no such prompt file"):
    read_prompts(PromptSource(str(tmp_path / "absent.jsonl")))


def test_host_slices_are_contiguous_disjoint_and_cover_every_row(tmp_path):
  path = _write_jsonl(tmp_path / "p.jsonl", _problems(10))
  slices = [read_prompts(PromptSource(path, "question"), shard=(h, 3)) for h in range(3)]
  assert [[r.row for r in s] for s in slices] == [[0, 1, 2], [3, 4, 5], [6, 7, 8, 9]]
  assert [slice_bounds(10, h, 3) for h in range(3)] == [(0, 3), (3, 6), (6, 10)]


def test_the_held_out_split_belongs_to_the_file_not_to_row_order(tmp_path):
  rows = read_prompts(PromptSource(_write_jsonl(tmp_path / "p.jsonl", _problems(40)), "question"))
  held, train = split_held_out(rows, 8)
  assert len(held) == 8 and len(train) == 32 and not {r.prompt for r in held} & {r.prompt for r in train}
  # the same file shuffled and grown by new rows holds out the same prompts (unless a new one hashes lower)
  shuffled = read_prompts(PromptSource(_write_jsonl(tmp_path / "q.jsonl", _problems(40)[::-1]), "question"))
  assert {r.prompt for r in split_held_out(shuffled, 8)[0]} == {r.prompt for r in held}


def test_a_duplicate_of_a_held_out_prompt_is_never_trained_on(tmp_path):
  records = _problems(20)
  rows = read_prompts(PromptSource(_write_jsonl(tmp_path / "p.jsonl", records), "question"))
  held = split_held_out(rows, 4)[0]
  duplicated = records + [{"question": held[0].prompt, "answer": "a different answer"}]
  rows = read_prompts(PromptSource(_write_jsonl(tmp_path / "d.jsonl", duplicated), "question"))
  held2, train2 = split_held_out(rows, 4)
  assert held[0].prompt in {r.prompt for r in held2} and held[0].prompt not in {r.prompt for r in train2}


def test_a_held_out_file_replaces_the_hash_split(tmp_path):
  rows = read_prompts(PromptSource(_write_jsonl(tmp_path / "p.jsonl", _problems(10)), "question"))
  given = read_prompts(PromptSource(_write_jsonl(tmp_path / "e.jsonl", _problems(3)), "question"))
  held, train = split_held_out(rows, 8, given)
  assert [r.prompt for r in held] == [r.prompt for r in given]
  assert [r.row for r in train] == list(range(3, 10))


def test_text_prompts_take_the_plain_format_and_messages_the_chat_template():
  assert render_prompt("2+2?", "Q: {prompt}\nA:", None, {}, "p.jsonl row 0") == "Q: 2+2?\nA:"
  template = (TEMPLATES / "chatml_qwen2_5.jinja").read_text()
  text = render_prompt([{"role": "user", "content": "2+2?"}], "{prompt}", template, {}, "p.jsonl row 0")
  assert text.endswith("<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n")
  with pytest.raises(PromptDataError, match="p.jsonl row 3: the prompt is a list of chat messages but no chat template"):
    render_prompt([{"role": "user", "content": "2+2?"}], "{prompt}", None, {}, "p.jsonl row 3")


def test_one_prompt_list_reader_for_sample_and_extract(tmp_path):
  """Text lines, .jsonl objects (fields kept, the prompt under the first key given, or a messages list), one-line
  errors naming the field, the file and the line."""
  from jaxpod.data.prompts import read_prompt_file
  from jaxpod.extract.config import read_prompts as extract_prompts
  from jaxpod.sample.run import read_prompts as sample_prompts
  (tmp_path / "p.txt").write_text("first\n\n second \n")
  assert read_prompt_file(str(tmp_path / "p.txt"), "x") == [{"prompt": "first"}, {"prompt": " second "}]
  chat = [{"role": "user", "content": "hi"}]
  (tmp_path / "p.jsonl").write_text('{"prompt": "a", "seed": 3}\n\n{"messages": %s}\n' % json.dumps(chat))
  assert sample_prompts(str(tmp_path / "p.jsonl")) == (["a", chat], [3, None])
  with pytest.raises(PromptDataError, match=r"extract.prompts=.*p.jsonl line 3: expected an object with a 'text' or "
                     r"'prompt' string$"):
    extract_prompts(str(tmp_path / "p.jsonl"))
