"""Causal-LM fine-tuning with LoRA (`jaxpod train --task.type causal_lm --task.lora.rank 8`): the train state's
params, optimizer state and EMA hold adapters only, the frozen base is held once in its buffers and sharded
like the base of a full run, and the loss decreases on the default tiny corpus."""
import jax
import numpy as np
import pytest
from flax import nnx

from jaxpod.train import train, state as st
from tests.train.test_lm_task import _lm_config, _losses


def _abstract(cfg):
  """(abstract TrainState, task) of a config, nothing allocated."""
  from jaxpod.train.task import make_task
  task = make_task(cfg)
  tx, _ = task.optimizer()
  return st.abstract_state(st.make_init_fn(task, tx, 0, cfg.task.data.global_batch_size)), task


def test_lora_state_holds_adapters_only_and_the_base_once(tmp_path):
  """With task.lora: params, opt_state and ema_params leaves are adapter-shaped (rank 8 in one dim), none is
  base-shaped; buffers hold the base exactly once; on (fsdp 2, model 2) the base is sharded as in a full run."""
  full, _ = _abstract(_lm_config(tmp_path, "full"))
  lora_state, _ = _abstract(_lm_config(tmp_path, "lora", task__lora__rank=8))
  assert _lm_config(tmp_path, "x", task__lora__rank=8).task.lora.rank == 8
  base_shapes = {tuple(x.shape) for x in jax.tree.leaves(full.params)}
  for part in ("params", "opt_state", "ema_params"):
    shapes = [tuple(x.shape) for x in jax.tree.leaves(getattr(lora_state, part)) if x.ndim > 1]
    assert shapes and all(8 in s for s in shapes) and not set(shapes) & base_shapes, (part, shapes)
  assert sorted(map(tuple, (x.shape for x in jax.tree.leaves(lora_state.buffers)))) == sorted(
      tuple(x.shape) for x in jax.tree.leaves(full.params))
  from jaxpod.runtime import make_mesh
  mesh = make_mesh(devices=jax.devices()[:4], data=1, fsdp=2, model=2)
  want = {jax.tree_util.keystr(p): s.spec for p, s in
          jax.tree_util.tree_flatten_with_path(st.train_state_shardings(full, mesh).params)[0]}
  got = {jax.tree_util.keystr(p): s.spec for p, s in
         jax.tree_util.tree_flatten_with_path(st.train_state_shardings(lora_state, mesh).buffers)[0]}
  assert got == want and any(any(a is not None for a in spec) for spec in got.values())


@pytest.mark.slow
def test_lora_causal_lm_learns_and_trains_only_adapters(tmp_path):
  """20 steps of rank-8 LoRA (lr 3e-2) from a tiny HF Llama (task.hf; initializer_range 0.2, so the frozen
  head can express more than near-uniform logits) on the built-in text: the loss falls by more than 1 nat, and
  the end-of-run SampleHook samples with the adapters; the checkpointed base is bit-identical to the HF weights (never updated)."""
  import json
  import orbax.checkpoint as ocp
  from pathlib import Path
  from jaxpod.models.llama import hf_io
  from jaxpod.runtime import make_mesh
  from tests.models.llama.hf_checkpoints import write_hf_checkpoint
  write_hf_checkpoint(tmp_path / "base", initializer_range=0.2)
  cfg = _lm_config(tmp_path, "lora", steps=20, task__lora__rank=8, task__optim__lr=3e-2, task__prompts='["The old"]',
                   task__hf=str(tmp_path / "base"))
  result = train(cfg)
  losses = [loss for _, loss, _ in _losses(result.run_dir)]
  first, last = np.mean(losses[:3]), np.mean(losses[-3:])
  print(f"LoRA r=8 loss {first:.3f} -> {last:.3f}")
  assert last < first - 1.0, (first, last)
  samples = [json.loads(l) for l in Path(result.run_dir, "samples.jsonl").read_text().splitlines()]
  assert [r["step"] for r in samples] == [20]  # the SampleHook ran the adapted model (base + adapters)
  with ocp.CheckpointManager(Path(result.run_dir, "checkpoints")) as mgr:
    saved = mgr.restore(20, args=ocp.args.Composite(state=ocp.args.StandardRestore()))["state"]
  base = st.to_nested(nnx.state(hf_io.load(str(tmp_path / "base"), make_mesh(devices=jax.devices()[:1]))))
  stored, want = jax.tree_util.tree_flatten_with_path(saved["buffers"])[0], jax.tree.leaves(base)
  assert len(stored) == len(want) == 2 + 9 + 1  # embed, norm, lm_head + 9 block weights (7 linear, 2 norms) [L, ...]
  from jaxpod.models.llama import lora
  llama = hf_io.load_config(str(tmp_path / "base"))  # the summary counts the adapters as trained, the base as frozen
  adapters = llama.num_hidden_layers * sum(8 * (n_in + n_out) for n_in, n_out, *_ in lora.shapes(llama).values())
  assert (result.trained_params, result.frozen_params) == (adapters, sum(np.asarray(w).size for w in want))
  for (path, x), w in zip(stored, want):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(w), err_msg=jax.tree_util.keystr(path))
  # the run wrote its EMA adapters as PEFT's files; a new run starts from them (task.adapter), well below the start
  adapter = Path(result.run_dir, "adapter")
  assert json.loads((adapter / "adapter_config.json").read_text())["r"] == 8
  again = train(_lm_config(tmp_path, "again", steps=2, task__optim__warmup_steps=1, task__prompts="[]",
                           task__hf=str(tmp_path / "base"), task__adapter=str(adapter)))
  resumed = _losses(again.run_dir)[0][1]
  print(f"from the exported adapter: first loss {resumed:.3f}")
  assert resumed < first - 2.0, (resumed, first)


def test_an_adapter_is_checked_before_jax(tmp_path, capsys):
  """task.adapter without task.hf, or with a task.lora that differs from its files: one line, at parse; the config
  keeps what was given (the adapter's LoRA is the task's, built once from the files)."""
  from jaxpod.cli.args import UsageError
  from jaxpod.models.llama import init, lora, peft_io, tiny
  from tests.models.llama.hf_checkpoints import write_hf_checkpoint
  write_hf_checkpoint(tmp_path / "base")
  peft_io.save_adapter(lora.attach(init(tiny()), lora.LoraConfig(rank=2)), str(tmp_path / "adapter"))
  capsys.readouterr()
  both = dict(task__adapter=str(tmp_path / "adapter"), task__hf=str(tmp_path / "base"))
  for overrides, msg in (({"task__adapter": both["task__adapter"]}, "needs task.hf"),
                         ({**both, "task__lora__rank": 4}, "differs from task.adapter's adapter_config.json")):
    with pytest.raises(UsageError):
      _lm_config(tmp_path, "x", **overrides)
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(err) == 1 and msg in err[0], err
  cfg = _lm_config(tmp_path, "x", **both)
  assert cfg.task.lora is None and cfg.task.lora_section().adapters() == lora.LoraConfig(rank=2)


@pytest.mark.slow
def test_lora_on_two_hosts_matches_one_host(launch_hosts, bucket, tmp_path):
  """Invariants 1, 8 and 10 for LoRA fine-tuning from a HF base in the bucket: 1 host x 1 device and 2 hosts x
  2 devices (fsdp 2: base and adapters split) take the same losses; each writes its adapter export to the bucket
  once, and the two exports agree and load onto the base."""
  import json
  from pathlib import Path
  from jaxpod.models.llama import hf_io, lora, peft_io
  from jaxpod.runtime import make_mesh, storage
  from tests.conftest import host_lines
  from tests.models.llama.hf_checkpoints import write_hf_checkpoint
  from tests.train.test_lm_task import _lm_args
  write_hf_checkpoint(tmp_path / "base", initializer_range=0.2)
  base = storage.join(bucket, "base")
  storage.upload(str(tmp_path / "base"), base)
  worker = Path(__file__).parents[2] / "train" / "workers" / "train_worker.py"
  runs, adapters = {}, {}
  for hosts, dph, mesh in ((1, 1, []), (2, 2, ["--mesh.fsdp=2"])):
    args = _lm_args(storage.join(bucket, "runs"), f"h{hosts}", steps=4, task__lora__rank=4, task__hf=base,
                    task__prompts="[]", task__optim__lr=3e-2) + mesh
    r = launch_hosts(worker, hosts=hosts, devices_per_host=dph, args=["run", *args])
    assert r.returncode == 0, r.transcript
    runs[hosts] = json.loads(host_lines(r, 0, "SUMMARY")[0])
    url = storage.join(runs[hosts]["run_dir"], "adapter")
    model = peft_io.load_adapter(hf_io.load(base, make_mesh(devices=jax.devices()[:1])), url)
    adapters[hosts] = {k: (np.asarray(a), np.asarray(b)) for k, (a, b) in lora.adapters(model).items()}
  one, two = (_losses(runs[h]["run_dir"]) for h in (1, 2))
  assert [s for s, _, _ in one] == [s for s, _, _ in two] == [1, 2, 3, 4]
  np.testing.assert_allclose([l for _, l, _ in two], [l for _, l, _ in one], rtol=2e-4)
  for k, (a, b) in adapters[1].items():
    np.testing.assert_allclose(adapters[2][k][0], a, atol=1e-4, err_msg=str(k))
    np.testing.assert_allclose(adapters[2][k][1], b, atol=1e-4, err_msg=str(k))
  assert any(np.abs(b).max() > 1e-3 for _, b in adapters[1].values())  # B moved away from zero
