"""`jaxpod extract` on Qwen3 and Gemma 3 checkpoints (tests/hf_families.py): the sharded capture forward, which
loops over the blocks with a traced layer index, gives each block's output as transformers computes it, past
Gemma 3's sliding window and through its local and global layers alike."""
import numpy as np
import pytest

from jaxpod import extract
from jaxpod.runtime import MeshConfig
from jaxpod.extract.sharded import TOLERANCE
from tests.extract.conftest import PROMPTS, hf_captures


@pytest.mark.parametrize("family", ["qwen3", "gemma3_text"])
def test_sharded_captures_equal_transformers_block_outputs(hf_family, family, tmp_path):
  """resid.i == HF block i's output, for every row (prompts up to 98 tokens; window 8); attn_out + mlp_out are
  what each block adds to the residual (Gemma 3: after its post-attention and post-feedforward norms)."""
  folder, hf_model = hf_family(family)
  prompts = tmp_path / "p.txt"
  prompts.write_text("\n".join(PROMPTS[:8]) + "\n")
  extract.run(extract.ExtractConfig(hf=folder, prompts=str(prompts), out=str(tmp_path / "out"), layers=(0, 1),
                                    points=("resid", "attn_out", "mlp_out"), batch_size=8, max_seq_len=112,
                                    progress=False, mesh=MeshConfig(data=4, model=2)))
  ds = extract.open(str(tmp_path / "out"))
  assert ds.num_rows == 8
  batch = next(ds.iter_batches(batch_size=8))
  for row in range(8):
    m = batch["mask"][row]
    hooks, _ = hf_captures(hf_model, batch["tokens"][row][m].tolist())
    for i in (0, 1):
      want = hooks[f"resid.{i}"]
      assert np.abs(batch[f"resid.{i}"][row][m] - want).max() <= TOLERANCE["float32"] * np.abs(want).max(), (row, i)
    added = batch["attn_out.1"][row][m] + batch["mlp_out.1"][row][m]
    np.testing.assert_allclose(batch["resid.0"][row][m] + added, batch["resid.1"][row][m], atol=1e-5)
