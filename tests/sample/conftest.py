"""A tiny random Llama saved in HF layout by jaxpod itself (byte-level tokenizer: no tokenizer files)."""
import pytest

from jaxpod.models.llama import hf_io, init
from jaxpod.runtime import make_mesh

from sample_fixtures import tiny_sample_cfg


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
  """Folder of a random tiny Llama (GQA 4/2, untied) in HF layout."""
  folder = tmp_path_factory.mktemp("tiny_llama")
  hf_io.save(init(tiny_sample_cfg(), seed=7), str(folder))
  return str(folder)


@pytest.fixture(scope="session")
def model(tiny_ckpt):
  """The tiny checkpoint loaded on one device (shared by the engine tests)."""
  import jax
  return hf_io.load(tiny_ckpt, make_mesh(devices=jax.devices()[:1]))
