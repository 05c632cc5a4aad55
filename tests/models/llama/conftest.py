"""Tiny random Llama checkpoints written by `transformers` (offline), shared by the llama tests."""
import pytest

from hf_checkpoints import write_hf_checkpoint


@pytest.fixture(scope="session")
def hf_gqa(tmp_path_factory):
  """(folder, torch model): GQA 4/2, untied embeddings."""
  folder = tmp_path_factory.mktemp("llama_gqa")
  return str(folder), write_hf_checkpoint(folder)
