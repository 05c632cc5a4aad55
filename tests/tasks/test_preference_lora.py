"""LoRA preference training (`jaxpod train --task.type preference --task.lora.rank 8`): the DPO train state holds
the base once and no reference copy, Adam's state covers the adapters only, the in-step reference is the base
with the adapters off, and bad LoRA settings fail in one line at parse (invariant 7: validate before JAX)."""
from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxpod.runtime import storage
from tests.tasks.conftest import TINY, pref_args


def _config(*args: str):
  """The TrainConfig `jaxpod train --task.type preference ARGS` runs (the built-in default's file underneath)."""
  from jaxpod.cli.train import load_config
  return load_config(["--task.type", "preference", "--trainer.runs_dir", "/nonexistent/runs", *args])


def _abstract(cfg):
  """(abstract TrainState, task): shapes only, nothing allocated, nothing launched."""
  from jaxpod.train import state as st
  from jaxpod.train.task import make_task
  task = make_task(cfg)
  tx, _ = task.optimizer()
  return st.abstract_state(st.make_init_fn(task, tx, 0, cfg.task.data.global_batch_size)), task


def _shapes(tree) -> list[tuple[int, ...]]:
  return sorted(tuple(x.shape) for x in jax.tree.leaves(tree))


def test_dpo_lora_state_holds_the_base_once_no_reference_and_adam_for_adapters_only():
  """Full DPO keeps params + a reference copy + Adam mu/nu of every weight; with --task.lora.rank 4 the buffers
  are the base exactly once (no "ref"), params are nnx.LoRAParam only, and every non-scalar optimizer leaf is
  an adapter (rank 4 in its shape), twice the adapters' elements in all (mu and nu)."""
  full, _ = _abstract(_config("--task.loss.kind", "dpo"))
  assert _shapes(full.buffers["ref"]) == _shapes(full.params)  # the copy LoRA removes
  state, task = _abstract(_config("--task.loss.kind", "dpo", "--task.lora.rank", "4"))
  assert task.pc.lora.rank == 4 and "ref" not in state.buffers
  assert _shapes(state.buffers) == _shapes(full.params)
  graphdef, adapters, base = task.abstract_model(0)
  assert all(isinstance(v, nnx.LoRAParam) for v in jax.tree.leaves(adapters, is_leaf=lambda v: isinstance(
      v, nnx.Variable)))
  base_shapes = set(_shapes(full.params))
  for part in ("params", "opt_state"):
    shapes = [s for s in _shapes(getattr(state, part)) if len(s) > 1]
    assert shapes and all(4 in s for s in shapes) and not set(shapes) & base_shapes, (part, shapes)
  size = lambda tree: sum(math.prod(x.shape) for x in jax.tree.leaves(tree))  # noqa: E731
  assert size(state.opt_state) - 2 * size(state.params) < 16  # mu + nu of the adapters, plus step counters
  assert size(state.params) < 0.1 * size(full.params)


def test_the_in_step_reference_is_the_base_with_the_adapters_off(tiny_ckpt, pair_file):
  """DPO loss at LoRA's start is log 2 (B = 0: policy = reference); with B moved, the policy's log-probs move and
  the reference's equal the plain base model's, computed from the same base arrays."""
  from jaxpod.models.llama import init, lora
  from jaxpod.models.llama.loss import token_logps
  from jaxpod.tasks.preference_loss import answer_logps
  from jaxpod.train.task import make_task
  cfg = _config("--task.hf", tiny_ckpt, "--task.data.path", pair_file, "--task.data.max_length", "20",
                "--task.data.max_prompt_length", "12", "--task.loss.kind", "dpo", "--task.lora.rank", "2",
                "--task.lora.target_modules", "[q_proj,down_proj]")
  task = make_task(cfg)
  graphdef, adapters, base = task._split(lora.attach(init(task.llama), cfg.task.lora))  # numpy draws: no compiles
  tokens_Px2xL = jnp.asarray(np.random.default_rng(0).integers(0, 256, (3, 2, 12)), jnp.int32)
  answer_Px2xL = jnp.broadcast_to(jnp.arange(12) >= 6, (3, 2, 12)).astype(jnp.int32)
  batch = {"tokens": tokens_Px2xL, "answer": answer_Px2xL}
  ref_graphdef, ref_state = task.reference(graphdef, base)
  assert ref_state is base and ref_graphdef == lora.base_graphdef(task.llama)
  tokens, answer = tokens_Px2xL.reshape(6, 12), answer_Px2xL.reshape(6, 12)

  @jax.jit
  def run(a, b):
    """(DPO loss, reference log-probs, policy log-probs) of adapters a on base b."""
    ref = answer_logps(token_logps(ref_graphdef, b, tokens[:, :-1], tokens[:, 1:]), answer[:, 1:])[0]
    pol = answer_logps(token_logps(graphdef, task.weights(a, b), tokens[:, :-1], tokens[:, 1:]), answer[:, 1:])[0]
    return task.loss_fn(graphdef)(a, b, batch, None, ())[0], ref, pol
  loss, ref, start = run(adapters, base)
  np.testing.assert_allclose(float(loss), math.log(2.0), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(ref), np.asarray(start), rtol=1e-5, atol=1e-5)
  moved = jax.tree.map(lambda x: x + 0.3 if x.shape[0] == 2 else x, adapters)  # every B [r, out]
  loss, ref_moved, pol = run(moved, base)
  np.testing.assert_array_equal(np.asarray(ref_moved), np.asarray(ref))
  assert float(jnp.max(jnp.abs(pol - ref))) > 1e-3 and float(loss) != pytest.approx(math.log(2.0))


def test_lora_learning_rate_comes_by_loss_and_the_flags_win():
  """One flag: --task.lora.rank 8 alone scales task.optim.lr by the loss's LR_SCALE (SimPO 2.5, DPO 3.25) and B's
  lr by its B_LR_RATIO (SimPO 2, DPO 3); task.lora.lr_scale and task.lora.b_lr_ratio win."""
  from jaxpod.tasks.preference_lora import B_LR_RATIO, LR_SCALE
  from jaxpod.train.task import make_task

  def peak(cfg) -> float:  # the schedule's lr at the end of its warm-up
    return float(make_task(cfg).optimizer()[1](cfg.task.optim.warmup_steps))
  assert (LR_SCALE["simpo"], B_LR_RATIO["simpo"], LR_SCALE["dpo"], B_LR_RATIO["dpo"]) == (2.5, 2.0, 3.25, 3.0)
  lr = peak(_config())
  assert lr == pytest.approx(_config().task.optim.lr)
  for args, ratio in ((("--task.lora.rank", "8"), 2.5), (("--task.lora.rank", "8", "--task.loss.kind", "dpo"), 3.25),
                      (("--task.lora.rank", "8", "--task.lora.lr_scale", "2"), 2)):
    assert peak(_config(*args)) == pytest.approx(ratio * lr), args


def test_lora_b_lr_ratio_multiplies_only_the_b_updates():
  """LoRA+: with task.lora.b_lr_ratio 3 every B's optimizer update is 3x the one at ratio 1 (2x with SimPO's
  default) and every A's equal."""
  updates = {}
  for ratio in ("1", "3", "0"):
    state, task = _abstract(_config("--task.lora.rank", "2", "--task.lora.b_lr_ratio", ratio))
    tx, _ = task.optimizer()
    params = jax.tree.map(lambda x: jnp.ones(x.shape, x.dtype), state.params)
    opt = tx.init(params)
    for _ in range(3):
      u, opt = tx.update(params, opt, params)
    updates[ratio] = {jax.tree_util.keystr(k): np.asarray(v) for k, v in jax.tree_util.tree_flatten_with_path(u)[0]}
  assert updates["1"].keys() == updates["3"].keys() == updates["0"].keys() and len(updates["1"]) == 7 * 2
  for k, one in updates["1"].items():
    assert np.all(one != 0), k
    for ratio, b in (("3", 3.0), ("0", 2.0)):
      np.testing.assert_allclose(updates[ratio][k], one * (b if "lora_b" in k else 1.0), rtol=1e-6, err_msg=k)


def _one_error_line(capsys, *args: str) -> str:
  from jaxpod.cli.args import UsageError
  capsys.readouterr()
  with pytest.raises(UsageError):
    _config(*args)
  err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
  assert len(err) == 1, err
  return err[0]


def test_bad_lora_settings_fail_in_one_line_at_parse(capsys, tmp_path, tiny_ckpt, pair_file):
  """rank < 1, an unknown target (the valid ones listed), an adapter for another base (the tensor and both shapes),
  and the settings LoRA cannot serve: each one line naming the field."""
  from jaxpod.models.llama import LlamaConfig, init, lora, peft_io
  hf = ["--task.hf", tiny_ckpt, "--task.data.path", pair_file, "--task.data.max_length", "20",
        "--task.data.max_prompt_length", "12"]
  assert "LoraConfig.rank=0 must be an integer >= 1" in _one_error_line(capsys, "--task.lora.rank", "0")
  line = _one_error_line(capsys, "--task.lora.rank", "2", "--task.lora.target_modules", "[q_proj,qkv_proj]")
  assert "['qkv_proj'] unknown" in line and "'gate_proj'" in line and "'down_proj'" in line
  other = LlamaConfig(**(TINY | {"intermediate_size": 48}))
  peft_io.save_adapter(lora.attach(init(other), lora.LoraConfig(rank=2)), str(tmp_path / "other"))
  line = _one_error_line(capsys, *hf, "--task.adapter", str(tmp_path / "other"))
  assert ("adapter tensor base_model.model.model.layers.0.mlp.gate_proj.lora_B.weight" in line
          and "has shape (48, 2); this model (config.json) needs (64, 2)" in line), line
  peft_io.save_adapter(lora.attach(init(LlamaConfig(**TINY)), lora.LoraConfig(rank=2)), str(tmp_path / "ok"))
  cases = (
      (["--task.adapter", str(tmp_path / "ok")], "task.adapter=", "needs task.hf"),
      ([*hf, "--task.adapter", str(tmp_path / "ok"), "--task.loss.kind", "dpo"],
       "task.reference=in_step", "use task.reference=precomputed"),
      ([*hf, "--task.adapter", str(tmp_path / "ok"), "--task.lora.rank", "4"], "task.lora=", "differs from"),
      (["--task.data.path", pair_file, "--task.lora.rank", "2"], "task.lora with task.data.path",
       "needs task.hf"),
      (["--task.lora.rank", "2", "--task.sort.warmup_steps", "0"], "task.sort.warmup_steps=0", "random frozen base"),
      (["--task.lora.rank", "2", "--task.lora.lr_scale", "-1"], "task.lora.lr_scale=-1", "must be > 0"),
      (["--task.lora.rank", "2", "--task.lora.b_lr_ratio", "-1"], "task.lora.b_lr_ratio=-1", "must be > 0"),
  )
  for args, field, fix in cases:
    line = _one_error_line(capsys, *args)
    assert field in line and fix in line, (args, line)
  ok = _config(*hf, "--task.adapter", str(tmp_path / "ok"), "--task.loss.kind", "dpo",
               "--task.reference", "precomputed")
  from jaxpod.tasks.preference_lora import section
  assert ok.task.lora is None and section(ok.task).adapters() == lora.LoraConfig(rank=2)  # the files', never written


@pytest.mark.slow
def test_a_short_lora_dpo_run_trains_the_adapters_and_leaves_the_base(tmp_path, tiny_ckpt, pair_file):
  """2 DPO steps with LoRA from the tiny checkpoint (the first at lr 0): the loss starts at log 2, every B moves
  (A's gradient is zero while B is), the base (the only weight copy, the reference) is bit-identical at the end,
  and the run writes its adapters as PEFT's files (`<run>/adapter`) that load back onto the base as trained."""
  from jaxpod.cli.train import load_config
  from jaxpod.train import train
  from tests.tasks.test_preference_task import KeepState, _metrics
  keep = KeepState()
  summary = train(load_config(pref_args(tmp_path, tiny_ckpt, pair_file, steps=2, trainer__run_name="lora",
                                        task__loss__kind="dpo", task__lora__rank=2)), extra_hooks=[keep])
  first = _metrics(summary.run_dir)[0]
  assert first["loss"] == pytest.approx(math.log(2.0), abs=1e-4)
  jax.tree.map(np.testing.assert_array_equal, keep.start["buffers"], keep.end["buffers"])
  end = dict(jax.tree_util.tree_flatten_with_path(keep.end["params"])[0])
  moved = {jax.tree_util.keystr(k): float(np.max(np.abs(v - end[k])))
           for k, v in jax.tree_util.tree_flatten_with_path(keep.start["params"])[0]}
  assert all(m > 0 for k, m in moved.items() if "lora_b" in k) and len(moved) == 7 * 2, moved  # every B moved (stacked)
  saved = json.loads(storage.read_text(storage.join(summary.run_dir, "summary.json")))
  assert saved["lora"]["rank"] == 2
  from safetensors.numpy import load_file
  from jaxpod.models.llama import hf_io, lora, peft_io
  from jaxpod.runtime import make_mesh
  folder = storage.join(summary.run_dir, "adapter")
  config = json.loads(storage.read_text(storage.join(folder, peft_io.CONFIG_FILE)))
  assert (config["peft_type"], config["r"], config["base_model_name_or_path"]) == ("LORA", 2, tiny_ckpt)
  names = load_file(storage.join(folder, peft_io.WEIGHTS_FILE))
  assert len(names) == 2 * 7 * 2 and peft_io.tensor_name(0, "q_proj", "A") in names
  loaded = lora.adapters(peft_io.load_adapter(hf_io.load(tiny_ckpt, make_mesh(devices=jax.devices()[:1])), folder))
  trained = {}  # (layer, projection) -> B [r, out] at the end of the run (stored stacked: B [L, r, out])
  for path, v in jax.tree_util.tree_flatten_with_path(keep.end["params"])[0]:
    keys = [getattr(p, "key", getattr(p, "idx", None)) for p in path]
    if "lora_b" in keys:
      name = next(k for k in keys if str(k).endswith("_lora"))[:-5]
      trained.update({(layer, name): b for layer, b in enumerate(np.asarray(v))})
  assert len(trained) == 14 and all(np.array_equal(np.asarray(loaded[k][1]), v) for k, v in trained.items())


def test_precomputed_reference_with_an_adapter_is_the_base_plus_the_adapter(tmp_path, tiny_ckpt, pair_file):
  """With task.adapter, DPO's reference must be the starting policy: start_weights (what precomputed runs
  once) gives the logits of the base with that adapter applied."""
  from flax import nnx
  from jaxpod.models.llama import LlamaConfig, forward, hf_io, init, lora, peft_io
  from jaxpod.runtime import make_mesh
  from jaxpod.tasks.preference_lora import start_weights
  from jaxpod.train.task import make_task
  model = lora.attach(init(LlamaConfig(**TINY)), lora.LoraConfig(rank=2))
  rng = np.random.default_rng(1)
  lora.set_adapters(model, {k: (a, rng.normal(0, 0.5, b.shape)) for k, (a, b) in lora.adapters(model).items()})
  peft_io.save_adapter(model, str(tmp_path / "adapter"))
  cfg = _config("--task.hf", tiny_ckpt, "--task.data.path", pair_file, "--task.data.max_length", "20",
                "--task.data.max_prompt_length", "12", "--task.loss.kind", "dpo", "--task.reference", "precomputed",
                "--task.adapter", str(tmp_path / "adapter"))
  mesh = make_mesh(devices=jax.devices()[:1])
  graphdef, params = start_weights(make_task(cfg), mesh)
  adapted = nnx.split(peft_io.load_adapter(hf_io.load(tiny_ckpt, mesh), str(tmp_path / "adapter"), mesh=mesh))
  plain = nnx.split(hf_io.load(tiny_ckpt, mesh))
  tokens = jnp.asarray(rng.integers(0, 256, (2, 10)), jnp.int32)
  logits = jax.jit(lambda g, p: forward(g, p, tokens).logits, static_argnums=0)
  start, want, base = logits(graphdef, params), logits(*adapted), logits(*plain)
  np.testing.assert_allclose(np.asarray(start), np.asarray(want), rtol=1e-4, atol=1e-4)
  assert float(jnp.max(jnp.abs(want - base))) > 1e-2
