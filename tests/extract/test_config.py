"""Bad inputs end with one clear line naming the field, before JAX initialises (DESIGN.md invariant 7)."""
import json
import subprocess
import sys

import pytest

from jaxpod.cli.args import comma_lists
from jaxpod.extract import ExtractConfig

# One subprocess runs every bad case through the CLI, then reports whether a JAX backend exists.
SCRIPT = r"""
import contextlib, io, json, sys
from jaxpod.cli.main import main
cases = json.loads(sys.argv[1])
out = {}
for name, argv in cases.items():
  err = io.StringIO()
  with contextlib.redirect_stderr(err):
    try:
      code = main(["extract", *argv])
    except SystemExit as e:
      code = e.code
  out[name] = [code, err.getvalue()]
from jax._src import xla_bridge
from jaxpod import runtime
out["jax_initialised"] = xla_bridge.backends_are_initialized() or runtime.is_initialized()
print("RESULT " + json.dumps(out))
"""


def test_bad_inputs_one_line_each_before_jax_init(tiny_ckpt, tmp_path):
  """Invariant 7: layer out of range, unknown point, missing model, unwritable out, indivisible batch."""
  model, _, prompts = tiny_ckpt
  blocker = tmp_path / "a_file"
  blocker.write_text("not a folder")
  base = ["--hf", model, "--prompts", prompts, "--layers", "0,2", "--out", str(tmp_path / "out")]

  def with_(**kw):
    argv = list(base)
    for k, v in kw.items():
      flag = "--" + k.replace("_", "-")
      if flag in argv:
        argv[argv.index(flag) + 1] = v
      else:
        argv += [flag, v]
    return argv

  cases = {
      "layer": (with_(layers="0,3"), "extract.layers=[0, 3]: [3] out of range; the model has 3 blocks"),
      "point": (with_(points="resid,mlp_in"), "extract.points=['resid', 'mlp_in']: unknown or repeated point"),
      "model": (with_(hf=str(tmp_path / "nope")), "extract.hf="),
      "out": (with_(out=str(blocker / "acts")), "is not writable"),
      "batch": (with_(batch_size="6", **{"mesh.data": "4"}), "extract.batch_size=6 is not divisible by the "
                "data-parallel size 4"),
      "prompts": (with_(prompts=str(tmp_path / "none.txt")), "extract.prompts="),
      "dtype": (with_(dtype="fp8"), "extract.dtype='fp8' is not supported"),
      "forward": (with_(forward="fast"), "extract.forward='fast' is not supported; use one of sharded|exact"),
  }
  r = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps({k: v[0] for k, v in cases.items()})],
                     capture_output=True, text=True, timeout=120)
  line = [l for l in r.stdout.splitlines() if l.startswith("RESULT ")]
  assert line, r.stdout + r.stderr
  got = json.loads(line[0][len("RESULT "):])
  for name, (_, expected) in cases.items():
    code, err = got[name]
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, f"{name}: exit {code}, stderr:\n{err}"
    assert expected in lines[0], f"{name}: {lines[0]!r}"
  assert "does not exist" in got["model"][1] and "--hf" in got["model"][1]
  assert not got["jax_initialised"], "a bad input was only caught after JAX initialised"


def test_list_options_accept_commas():
  assert comma_lists(ExtractConfig, ["--layers", "4,8", "--points=resid,mlp_out", "--out", "x"]) == [
      "--layers", "[4,8]", "--points=[resid,mlp_out]", "--out", "x"]


def test_config_fields_validated_on_construction():
  with pytest.raises(ValueError, match="extract.layers is empty"):
    ExtractConfig(hf="m", prompts="p", out="o")
  with pytest.raises(ValueError, match="extract.batch_size=0 must be >= 1"):
    ExtractConfig(hf="m", prompts="p", out="o", layers=(1,), batch_size=0)
  with pytest.raises(ValueError, match=r"extract.memory_fraction=0 must be in \(0, 1\]"):
    ExtractConfig(hf="m", prompts="p", out="o", layers=(1,), memory_fraction=0)
  cfg = ExtractConfig(hf="m", prompts="p", out="o", layers=(8, 4), points=("resid", "mlp_out"))
  assert cfg.keys == ("resid.4", "mlp_out.4", "resid.8", "mlp_out.8")


def test_prompt_files_txt_and_jsonl(tmp_path):
  """.txt: one prompt per non-empty line; .jsonl: "text" or "prompt"; a bad line is named."""
  from jaxpod.extract.config import read_prompts
  (tmp_path / "p.txt").write_text("first\n\n second \n")
  assert read_prompts(str(tmp_path / "p.txt")) == ["first", " second "]
  (tmp_path / "p.jsonl").write_text('{"text": "a"}\n{"prompt": "b", "id": 2}\n\n')
  assert read_prompts(str(tmp_path / "p.jsonl")) == ["a", "b"]
  (tmp_path / "bad.jsonl").write_text('{"text": "a"}\n{"body": "b"}\n')
  with pytest.raises(ValueError, match="line 2: expected an object with a 'text' or 'prompt' string"):
    read_prompts(str(tmp_path / "bad.jsonl"))
