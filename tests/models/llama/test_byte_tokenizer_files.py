"""A byte-level policy exported as HF files tokenizes identically in transformers and in jaxpod."""
import pytest

from jaxpod.models.llama.tokenizer import ByteTokenizer, load_tokenizer, save_byte_tokenizer

TEXTS = ["", "123+456=", "sort: 9 3 3 1", "héllo wörld ✓", "tabs\tand\nnewlines  ", "<eos> and </s> are text here"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
  out = tmp_path_factory.mktemp("byte_tok")
  save_byte_tokenizer(str(out))
  return out


@pytest.mark.parametrize("text", TEXTS)
def test_transformers_encodes_like_byte_tokenizer(folder, text):
  from transformers import AutoTokenizer
  hf = AutoTokenizer.from_pretrained(folder, local_files_only=True)
  ids = ByteTokenizer().encode(text)
  assert hf(text)["input_ids"] == ids
  assert hf.decode(ids, skip_special_tokens=True) == text
  assert (hf.bos_token_id, hf.eos_token_id, hf.pad_token_id) == (256, 257, 258)


@pytest.mark.parametrize("text", TEXTS)
def test_jaxpod_reads_the_files_back_as_the_same_tokenizer(folder, text):
  tok = load_tokenizer(str(folder))
  assert tok.encode(text) == ByteTokenizer().encode(text)
  assert tok.decode(tok.encode(text) + [257, 258]) == text
  assert (tok.bos_id, tok.eos_ids, tok.pad_id) == (256, (257,), 258)
