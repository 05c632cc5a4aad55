"""Pair files: rows become [2, L] pairs whose answer mask covers exactly the answer; bad rows are named and counted."""
from __future__ import annotations

import json

import numpy as np
import pytest

from jaxpod.data.preference_files import BadRow, read_pair_file, row_to_pair
from jaxpod.models.llama.tokenizer import ByteTokenizer
from tests.tasks.conftest import CHAT_TEMPLATE

pytest.importorskip("datasets")
TOK = ByteTokenizer()


def _answer_text(pair, side: int) -> bytes:
  return bytes(int(t) for t, m in zip(pair["tokens"][side], pair["answer"][side]) if m and t < 256)


def test_a_text_pair_masks_only_its_answer_and_ends_it_with_eos():
  pair, cut = row_to_pair({"prompt": "sort:31=", "chosen": "13", "rejected": "3"}, TOK, 12, 20)
  assert not cut
  assert _answer_text(pair, 0) == b"13" and _answer_text(pair, 1) == b"3"
  ends = [int(pair["tokens"][s][np.nonzero(pair["answer"][s])[0][-1]]) for s in (0, 1)]
  assert ends == [TOK.eos_ids[0]] * 2  # EOS belongs to the answer, as in TRL
  prompt = [int(t) for t, m in zip(pair["tokens"][0], pair["answer"][0]) if not m and t != TOK.pad_id]
  assert prompt == TOK.encode("sort:31=")


def test_chat_pairs_render_with_the_template_and_mask_what_follows_the_prompt():
  row = {"prompt": [{"role": "user", "content": "hi"}], "chosen": [{"role": "assistant", "content": "hello"}],
         "rejected": [{"role": "assistant", "content": "go away"}]}
  pair, _ = row_to_pair(row, TOK, 32, 48, CHAT_TEMPLATE, {})
  assert _answer_text(pair, 0) == b"hello<|end|>" and _answer_text(pair, 1) == b"go away<|end|>"
  implicit = {"chosen": row["prompt"] + row["chosen"], "rejected": row["prompt"] + row["rejected"]}
  same, _ = row_to_pair(implicit, TOK, 32, 48, CHAT_TEMPLATE, {})
  np.testing.assert_array_equal(same["tokens"], pair["tokens"])  # the implicit prompt is the shared messages


def test_truncation_keeps_the_prompt_end_and_cuts_the_answer_end():
  pair, cut = row_to_pair({"prompt": "abcdefgh", "chosen": "0123456789", "rejected": "x"}, TOK, 4, 8)
  assert cut
  assert bytes(int(t) for t in pair["tokens"][0][:4]) == b"efgh"
  assert _answer_text(pair, 0) == b"0123"


@pytest.mark.parametrize("row,reason", [({"prompt": "p", "chosen": "a"}, "missing column 'rejected'"),
                                        ({"prompt": "p", "chosen": " ", "rejected": "b"}, "empty answer"),
                                        ({"prompt": "p", "chosen": "a", "rejected": "a"}, "identical"),
                                        ({"prompt": [{"role": "user", "content": "x"}],
                                          "chosen": [{"role": "assistant", "content": "a"}],
                                          "rejected": [{"role": "assistant", "content": "b"}]}, "no chat template")])
def test_a_bad_row_says_why(row, reason):
  with pytest.raises(BadRow, match=reason):
    row_to_pair(row, TOK, 12, 20)


def test_chosen_and_rejected_rendering_different_prompts_is_a_bad_row():
  template = "{% for m in messages %}{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}>{% endif %}"
  row = {"chosen": [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a"}],
         "rejected": [{"role": "user", "content": "q2"}, {"role": "assistant", "content": "b"}]}
  with pytest.raises(BadRow, match="different prompts"):
    row_to_pair(row, TOK, 12, 20, template, {})


def test_an_implicit_text_prompt_is_the_shared_prefix():
  pair, _ = row_to_pair({"chosen": "sort:31=13", "rejected": "sort:31=3"}, TOK, 12, 20)
  assert _answer_text(pair, 0) == b"13" and _answer_text(pair, 1) == b"3"


def test_bad_rows_are_named_by_row_number_and_refused_above_the_fraction(tmp_path):
  rows = [{"prompt": "p", "chosen": f"a{i}", "rejected": f"b{i}"} for i in range(20)]
  rows[7] = {"prompt": "p", "chosen": "a"}  # row 7: no rejected
  path = tmp_path / "pairs.jsonl"
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  arrays, report = read_pair_file(str(path), TOK, 4, 12, max_bad_fraction=0.1)
  assert report["pairs"] == 19 and report["bad"] == 1 and "missing column" in report["bad_rows"]["7"]
  assert arrays["tokens"].shape == (19, 2, 12) and arrays["tokens"].dtype == np.uint16
  with pytest.raises(ValueError, match=r"1 of 20 rows are bad \(row 7: missing column 'rejected'\).*max_bad_fraction"):
    read_pair_file(str(path), TOK, 4, 12, max_bad_fraction=0.01)


def test_parquet_reads_like_jsonl(tmp_path):
  import datasets
  rows = [{"prompt": "p", "chosen": f"a{i}", "rejected": f"b{i}"} for i in range(5)]
  datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "pairs.parquet"))
  (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  a, _ = read_pair_file(str(tmp_path / "pairs.parquet"), TOK, 4, 12, 0.0)
  b, _ = read_pair_file(str(tmp_path / "pairs.jsonl"), TOK, 4, 12, 0.0)
  np.testing.assert_array_equal(a["tokens"], b["tokens"])
