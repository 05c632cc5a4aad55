"""jaxpod.extract: layer activations of a sharded Llama over a prompt set, written per host,
read back as one dataset in sample order.

    from jaxpod import extract
    extract.run(extract.ExtractConfig(hf="ckpt/", prompts="p.txt", layers=(4, 8), out="gs://b/acts"))
    ds = extract.open("gs://b/acts")     # completeness-checked; ds["resid.4"] -> [N, T, D]
    extract.export("gs://b/acts", "gs://b/acts-arrow")   # Arrow files HF `datasets` loads
"""
from jaxpod.extract.config import DTYPES, POINTS, ExtractConfig, check_inputs
from jaxpod.extract.reader import Completeness, Dataset, IncompleteDataset, open  # noqa: A004


def run(cfg: ExtractConfig, runtime_cfg=None, on_batch=None) -> dict:
  """Run an extraction on every host of the job (see `jaxpod.extract.engine.run`)."""
  from jaxpod.extract import engine
  return engine.run(cfg, runtime_cfg, on_batch)


def export(url: str, out: str, to: str = "arrow", keys=None) -> dict:
  """Write the dataset at `url` as Arrow files under `out` (see `jaxpod.extract.export.export`)."""
  from jaxpod.extract.export import export as export_dataset
  return export_dataset(url, out, to=to, keys=keys)
