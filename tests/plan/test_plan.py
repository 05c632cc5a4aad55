"""`jaxpod plan`: parameter counts from jaxpod's own model, the scale.md figures, per-phase bytes, one-line errors.

Invariant 10 (every host moves only its share): the plan predicts per-host and per-device bytes of each
phase; these tests pin its arithmetic to the decoder jaxpod builds and to the published model sizes.
"""
from __future__ import annotations

import dataclasses
import json

import pytest

from jaxpod.cli.main import main
from jaxpod.models.llama.config import LlamaConfig, tiny
from jaxpod.plan import PHASES, PlanOptions, PodShape, Workload, kv_bytes_per_token, make_plan, plan_for, resolve, tensors
from jaxpod.runtime.mesh import MeshConfig

GB = 1e9
FAMILY_SWITCHES = {
    "llama": {},
    "llama_untied_bf16": {"tie_word_embeddings": False, "dtype": "bfloat16"},
    "qwen2": {"model_type": "qwen2", "qkv_bias": True},
    "qwen3": {"model_type": "qwen3", "qk_norm": True, "head_dim": 32},
    "gemma3_text": {"model_type": "gemma3_text", "qk_norm": True, "norm_plus_one": True, "sandwich_norms": True,
                    "tie_word_embeddings": True, "hidden_act": "gelu_pytorch_tanh"},
}


@pytest.mark.parametrize("name", sorted(FAMILY_SWITCHES))
def test_tensors_match_the_models_leaves(name):
  """Every leaf of jaxpod's initialised tiny model (path, shape, logical axes, count) is one plan tensor: a missing
  bias or norm in the plan's arithmetic fails here."""
  import jax
  from flax import nnx
  from jaxpod.models.llama.model import init
  cfg = tiny(**FAMILY_SWITCHES[name])
  model = init(cfg)
  leaves = {".".join(str(k) for k in path): v for path, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
  planned = {t.name: t for t in tensors(cfg)}
  assert set(planned) == set(leaves)
  for key, var in leaves.items():
    assert tuple(var.shape) == planned[key].shape, key
    assert tuple(var.get_metadata()["logical_axes"]) == planned[key].axes, key
  count = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
  assert sum(t.size for t in planned.values()) == count == cfg.num_params()


def test_shipped_models_match_the_published_sizes():
  """scale.md's table: weights, embedding and KV per token of Llama-3-8B, Qwen2.5-32B, Llama-3-70B in bf16."""
  expect = {"llama-3-8b": (16.1, 1.05, 131), "qwen2.5-32b": (65.5, 1.56, 262), "llama-3-70b": (141.1, 2.10, 328)}
  for name, (weights, embedding, kv_kb) in expect.items():
    cfg = resolve(name)
    assert cfg.dtype == "bfloat16"
    assert round(sum(t.size for t in tensors(cfg)) * 2 / GB, 1) == weights, name
    assert round(cfg.vocab_size * cfg.hidden_size * 2 / GB, 2) == embedding, name
    assert round(kv_bytes_per_token(cfg) / 1e3) == kv_kb, name


def test_pod_presets():
  """v5p-64 is 8 hosts x 4 chips of 95 GB; v5e-256 is 64 hosts x 4 chips of 16 GB; a GPU node is 8 x 80 GB."""
  assert dataclasses.astuple(PodShape.named("v5p-64"))[1:] == (8, 4, 95.0, 400.0)
  assert dataclasses.astuple(PodShape.named("v5e-256"))[1:4] == (64, 4, 16.0)
  assert dataclasses.astuple(PodShape.named("h100x8"))[1:4] == (1, 8, 80.0)


def test_70b_on_v5p64_names_every_phase_and_what_does_not_fit():
  """Replicated (jaxpod's default mesh: data over every device) 70B does not fit and the plan names fsdp; sharded
  over fsdp=32 every host reads, exports and checkpoints its share (model / 8)."""
  pod = PodShape.named("v5p-64")
  cfg = resolve("llama-3-70b")
  replicated = make_plan(cfg, pod, Workload())
  assert [p.name for p in replicated.phases] == list(PHASES)
  assert not replicated.fits
  problems = dict(line.split(": ", 1) for line in replicated.problems)
  assert "--mesh.fsdp" in problems["load"] and "--mesh.fsdp to >= 16" in problems["train"]
  assert "--ema 0" in problems["train"]
  assert replicated.phase("load").read_per_host == replicated.param_bytes  # every host needs everything

  sharded = make_plan(cfg, pod, Workload(mesh=MeshConfig(data=1, fsdp=-1), ema=0.0, batch=32, seq_len=1024))
  assert sharded.fits, sharded.problems
  share = sharded.param_bytes / 8
  load, train = sharded.phase("load"), sharded.phase("train")
  assert load.read_per_host == pytest.approx(share, rel=1e-3)  # norms are replicated: a few KB over the share
  assert load.ram_per_host < 0.05 * share  # a few tensors' share, not the model
  assert sharded.phase("export").written_per_host == pytest.approx(share, rel=1e-3)
  assert train.parts["params"] == pytest.approx(sharded.param_bytes / 32, rel=1e-3)
  assert train.parts["optimizer"] == 2 * train.parts["params"] and train.parts["ema"] == 0
  assert sharded.phase("checkpoint").ram_per_host == pytest.approx(3 * share, rel=1e-2)  # params + mu + nu


def test_ema_reference_and_kv_follow_the_workload():
  """EMA at ema > 0 and a DPO reference each add one params copy per device; KV is split by data shard and a
  colocated engine's weights are replicated over data and fsdp (the inference layout)."""
  cfg, pod = resolve("llama-3-8b"), PodShape.named("v5p-64")
  base = Workload(mesh=MeshConfig(data=8, fsdp=4), ema=0.0)
  plain = make_plan(cfg, pod, base).phase("train")
  both = make_plan(cfg, pod, dataclasses.replace(base, ema=0.5, reference=True)).phase("train")
  assert both.hbm_per_device - plain.hbm_per_device == 2 * plain.parts["params"]
  rl = make_plan(cfg, pod, dataclasses.replace(base, kind="rl", kv_rows=256, kv_len=1024)).phase("kv")
  assert rl.active and rl.parts["kv cache"] == 256 // 32 * 1024 * kv_bytes_per_token(cfg)
  assert rl.parts["engine weights"] == sum(t.size for t in tensors(cfg)) * 2
  tp = make_plan(cfg, pod, dataclasses.replace(base, kind="rl", kv_rows=256, kv_len=1024,
                                               mesh=MeshConfig(data=8, model=4))).phase("kv")
  assert tp.parts["kv cache"] == 256 // 8 * 1024 * kv_bytes_per_token(cfg) // 4  # kv heads split over model
  assert not make_plan(cfg, pod, base).phase("publish").active
  publish = make_plan(cfg, pod, dataclasses.replace(base, kind="rl", colocated=False)).phase("publish")
  assert publish.active and publish.written_per_host < 1.25 * sum(t.size for t in tensors(cfg)) * 2 / 8


def test_model_from_a_folder_a_url_and_a_workload_section(tmp_path):
  """A checkpoint folder, a config.json, and a workload YAML whose model section gives fields or points at a folder
  read the same architecture, through jaxpod's config reader."""
  cfg = tiny(dtype="bfloat16")
  folder = tmp_path / "ckpt"
  folder.mkdir()
  (folder / "config.json").write_text(json.dumps(cfg.to_hf_config()))
  section = tmp_path / "run.yaml"
  section.write_text("task:\n  type: causal_lm\n  model:\n    vocab_size: 300\n    hidden_size: 64\n"
                     "    intermediate_size: 128\n    num_hidden_layers: 2\n    num_attention_heads: 4\n"
                     "    num_key_value_heads: 2\n    dtype: bfloat16\n")
  pointer = tmp_path / "rl.yaml"
  pointer.write_text(f"model:\n  hf: {folder}\n")
  counts = {str(s): sum(t.size for t in tensors(resolve(str(s)))) for s in
            (folder, folder / "config.json", "file://" + str(folder), section, pointer)}
  assert set(counts.values()) == {cfg.num_params()}


def test_cli_table_json_and_exit_codes(tmp_path, capsys):
  """The table names every phase, --json writes the same plan, exit 1 when something does not fit."""
  out = tmp_path / "plan.json"
  assert main(["plan", "--model", "llama-3-70b", "--pod", "v5p-64", "--json", str(out)]) == 1
  text = capsys.readouterr().out
  assert all(name in text for name in PHASES) and "does not fit: train" in text
  saved = json.loads(out.read_text())
  assert [p["name"] for p in saved["phases"]] == list(PHASES) and not saved["fits"]
  assert main(["plan", "--model", "llama-3-8b", "--pod", "v5p-64", "--mesh.data", "8", "--mesh.fsdp", "4",
               "--batch", "32", "--seq_len", "1024"]) == 0
  p = plan_for(PlanOptions(model="llama-3-8b", pod="v5p-64", hosts=4))
  assert p.pod["hosts"] == 4 and p.pod["devices_per_host"] == 4


@pytest.mark.parametrize("argv,field", [
    (["--model", "no-such-model", "--pod", "v5p-64"], "model=no-such-model"),
    (["--model", "llama-3-8b", "--pod", "v9-3"], "pod='v9-3'"),
    (["--model", "llama-3-8b", "--pod", "v5p-64", "--mesh.fsdp", "3"], "mesh"),
    (["--model", "llama-3-8b", "--pod", "v5p-64", "--optimizer", "lion"], "optimizer='lion'"),
    (["--model", "llama-3-8b", "--pod", "v5p-64", "--ema", "1.5"], "ema=1.5"),
    (["--model", "llama-3-8b"], "pod is required"),
    (["--pod", "v5p-64"], "model is required"),
])
def test_bad_input_is_one_line_naming_the_field(argv, field, capsys):
  """Invariant 7's style: a bad field ends the command with exit 2 and one line naming it."""
  assert main(["plan", *argv]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and field in err[0], err


def test_bad_config_json_names_the_field(tmp_path):
  """A config.json jaxpod's families refuse is refused by plan the same way (one reader, one message)."""
  bad = tmp_path / "config.json"
  bad.write_text(json.dumps({**LlamaConfig().to_hf_config(), "hidden_act": "relu"}))
  with pytest.raises(ValueError, match="hidden_act"):
    resolve(str(bad))


def test_compile_is_a_bare_flag_and_the_plan_knobs_parse():
  from jaxpod.cli.args import parse
  o = parse(PlanOptions, ["--model", "llama-3-8b", "--pod", "v5p-64", "--compile", "--remat", "full",
                          "--param_dtype", "float32", "--layers", "2", "--microbatches", "2", "--batch", "64"], "plan")
  assert o.compile and o.model_config().remat == "full" and o.model_config().param_dtype == "float32"
  assert o.model_config().num_hidden_layers == 2 and o.microbatches == 2
  assert not parse(PlanOptions, ["--model", "llama-3-8b", "--pod", "v5p-64", "--compile=false"], "plan").compile
