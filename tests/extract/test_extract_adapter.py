"""`jaxpod extract --adapter DIR`: a PEFT LoRA adapter on the checkpoint (loaded as `jaxpod sample --adapter`
loads it), folded into the base once before the forward."""
import dataclasses
import json

import jax
import numpy as np
import pytest

from jaxpod import extract
from jaxpod.models.llama import hf_io, lora, peft_io
from jaxpod.runtime import make_mesh

from tests.extract.conftest import BASE_OPTIONS, assert_same_dataset


@pytest.mark.slow
def test_extract_with_an_adapter_equals_the_merged_checkpoint(tiny_ckpt, tmp_path):
  """The activations are byte-identical to an extraction of the merged weights saved as a HF checkpoint; the
  adapter is part of the run's identity (resuming without it is refused); an adapter whose shapes do not fit
  the base fails in one line before JAX."""
  model_dir, _, prompts = tiny_ckpt
  mesh = make_mesh(devices=jax.devices()[:1])
  adapted = lora.attach(hf_io.load(model_dir, mesh), lora.LoraConfig(rank=2), mesh=mesh)
  rng = np.random.default_rng(0)
  lora.set_adapters(adapted, {k: (a, rng.normal(0, 0.5, b.shape)) for k, (a, b) in lora.adapters(adapted).items()})
  peft_io.save_adapter(adapted, str(tmp_path / "adapter"), base_model=model_dir)
  hf_io.save(adapted, str(tmp_path / "merged"))  # a plain HF checkpoint of W + s * A B
  opts = dict(prompts=prompts, batch_size=8, **BASE_OPTIONS)
  cfg = extract.ExtractConfig(hf=model_dir, adapter=str(tmp_path / "adapter"), out=str(tmp_path / "a"), **opts)
  extract.run(cfg)
  extract.run(extract.ExtractConfig(hf=str(tmp_path / "merged"), out=str(tmp_path / "m"), **opts))
  got, want = extract.open(str(tmp_path / "a")), extract.open(str(tmp_path / "m"))
  assert_same_dataset(got, want)
  base, merged = (np.asarray(hf_io.load(d, mesh).layers.mlp.down_proj[...][0])
                  for d in (model_dir, str(tmp_path / "merged")))
  assert np.abs(merged - base).max() > 1e-2  # so the equality above says the adapter reached the forward
  assert json.loads((tmp_path / "a" / "run.json").read_text())["adapter"] == cfg.adapter
  with pytest.raises(ValueError, match="adapter"):
    extract.run(extract.ExtractConfig(hf=model_dir, out=str(tmp_path / "a"), **opts))
  bad = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text()) | {"r": 3}
  (tmp_path / "adapter" / "adapter_config.json").write_text(json.dumps(bad))
  with pytest.raises(ValueError, match="extract.adapter=.*has shape") as e:
    extract.run(dataclasses.replace(cfg, out=str(tmp_path / "b")))
  assert "\n" not in str(e.value)
