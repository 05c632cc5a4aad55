"""LoRA in `jaxpod rl`: adapters only on the wire, swapped into a worker's engine without recompiling, and
GRPO on adapters over a frozen base (no second copy for the KL reference)."""
from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

from jaxpod.models.llama import hf_io, init, lora
from jaxpod.models.llama.config import LlamaConfig
from jaxpod.policy.spec import PolicyModelConfig, PolicySpec
from jaxpod.rl.config import RLLoraConfig, RolloutConfig
from jaxpod.runtime import make_mesh
from jaxpod.sample.layout import param_bytes
from tests.conftest import compiles as compile_log

LLAMA = LlamaConfig(vocab_size=259, hidden_size=128, intermediate_size=384, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                    tie_word_embeddings=True, bos_token_id=256, eos_token_id=(257,), pad_token_id=258)
PROMPTS = [[256, 3 + i, 40 + 7 * i, 9] for i in range(8)]


def _trainer(tmp_path, mesh, rank=1):
  """(base url, the trainer's adapted model, its adapters: what a LoRA trainer's state.params are)."""
  base_url = str(tmp_path / "base")
  hf_io.save(init(LLAMA, seed=0), base_url)
  model = lora.attach(hf_io.load(base_url, mesh), lora.LoraConfig(rank=rank), mesh=mesh)
  return base_url, model, nnx.state(model, nnx.LoRAParam)


def _moved(adapters, seed=1):
  """Another adapter version: same tree, shapes and shardings, B non-zero."""
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda x: jax.device_put(rng.normal(0, 0.5, x.shape).astype(x.dtype), x.sharding), adapters)


@pytest.mark.parametrize("mode", ["checkpoint", "arrow_flight"])
def test_only_adapters_go_on_the_wire(tmp_path, mode):
  """Invariant 10 for LoRA RL: a version is the LoRAParam leaves alone, <= 2% of the model's bytes at rank 1 on the
  rl default's shape, and a worker receives them onto its base (loaded once) with the values sent."""
  from types import SimpleNamespace
  from jaxpod.rl.adapters import weights, worker_side
  from jaxpod.transfer import TransferConfig, create_client, create_server
  from jaxpod.transfer.hooks import PublishWeightsHook, adapters_of
  mesh = make_mesh(devices=jax.devices()[:1])
  base_url, model, adapters = _trainer(tmp_path, mesh)
  base_bytes = param_bytes(nnx.state(model, nnx.Not(nnx.LoRAParam)))
  cfg = TransferConfig(mode=mode, coordinator="filesystem", folder=str(tmp_path / "weights"))
  policy = PolicySpec(PolicyModelConfig(), base_url, RLLoraConfig(rank=lora.lora_config(model).rank))
  with create_server(cfg) as server, create_client(cfg) as raw:
    _, like, client = worker_side(policy, LLAMA, mesh, raw)
    moved = _moved(adapters)
    whole = weights(moved, nnx.state(model, nnx.Not(nnx.LoRAParam)))  # a state whose params are the whole model
    hook = PublishWeightsHook(server, every=1, select=adapters_of, background=False)  # the LoRAParam filter
    hook(SimpleNamespace(step=3, state=SimpleNamespace(params=whole)))
    sent = hook.history[-1]["bytes"]
    update = client.receive(like, wait=30)
  assert sent == param_bytes(adapters) and sent / base_bytes <= 0.02, sent / base_bytes
  assert update.weight_id == 3 and update.metrics.nbytes == sent
  got = dict(nnx.to_flat_state(update.params))
  for path, v in nnx.to_flat_state(moved):
    np.testing.assert_array_equal(np.asarray(got[path].get_value()), np.asarray(v.get_value()))
  assert param_bytes(update.params) == base_bytes + sent  # the base it loaded + the adapters fetched


def test_adapter_publish_changes_outputs_without_recompiling(tmp_path):
  """Invariant 9 with adapters: a worker fetches each published adapter version (checkpoint transport) and swaps it
  into its engine between generations with no new compilation (publish, fetch, swap and generate counted), its
  outputs CHANGE (the classic silent failure: an adapter that never reaches the engine), and every token
  carries the new version."""
  from jaxpod.policy.engine import make_sampler
  from jaxpod.rl.adapters import worker_side
  from jaxpod.transfer import TransferConfig, create_client, create_server
  mesh = make_mesh(devices=jax.devices()[:1])
  base_url, model, adapters = _trainer(tmp_path, mesh)
  cfg = TransferConfig(mode="checkpoint", coordinator="filesystem", folder=str(tmp_path / "weights"))
  policy = PolicySpec(PolicyModelConfig(), base_url, RLLoraConfig(rank=lora.lora_config(model).rank))
  rollout = RolloutConfig(batch_size=8, eval_slots=8, max_prompt_len=8, max_new_tokens=6, temperature=1.0)
  with create_server(cfg) as server, create_client(cfg) as raw:
    graphdef, like, client = worker_side(policy, LLAMA, mesh, raw)
    server.publish(0, adapters)
    update = client.receive(like, wait=30)
    sampler = make_sampler(graphdef, update.params, mesh, rollout, stop_ids=(), version=update.weight_id)
    sampler.generate(PROMPTS, range(8))  # no stop ids: every row runs to its limit, the same programs every time
    before = sampler.generate(PROMPTS, range(8))
    moved = _moved(adapters)  # the trainer's side, before counting
    compiles = compile_log()
    server.publish(1, moved)
    update = client.receive(like, wait=30)
    sampler.update_params(update.params, update.weight_id)
    after = sampler.generate(PROMPTS, range(8))
  assert compiles == [], compiles
  assert [c.sampled for c in after] != [c.sampled for c in before]
  assert all(set(c.versions) == {1} for c in after) and all(set(c.versions) == {0} for c in before)


@pytest.mark.slow
def test_grpo_with_lora_trains_the_adapters_and_references_the_base(warm_policy, tmp_path):
  """`jaxpod rl --lora.rank 1` (colocated, beta > 0): the train state's params are the adapters alone, the base is
  held once in the buffers (no reference copy: the KL reference is the base with the adapters off, so KL > 0
  once the adapters move), the engine samples with the adapters (behaviour log-probs = the trainer's), and the
  run exports the merged model and PEFT's adapter files."""
  import json
  import draccus
  from jaxpod.rl.config import RLConfig
  from jaxpod.rl.run import run, run_dir
  from tests.rl.clusters import TINY
  # one update per batch (LoRA's default is 2): the logged log-prob gap is then the engine's against the trainer's
  cfg = draccus.parse(RLConfig, args=[*TINY, "--model.hf", warm_policy, "--lora.rank", "1", "--grpo.beta", "0.05",
                                      "--grpo.num_iterations", "1", "--trainer.steps", "3", "--trainer.eval_every", "3",
                                      "--trainer.eval_at_start", "false", "--trainer.runs_dir", str(tmp_path)])
  run(cfg)
  folder = run_dir(cfg)
  rows = [json.loads(line) for line in open(f"{folder}/train/metrics.jsonl")]
  last = [r for r in rows if "kl" in r][-1]
  assert last["kl"] > 0 and abs(last["logprob_gap"]) < 1e-4
  assert last["lr"] == pytest.approx(5 * 3e-4 * 2 / 5)  # lr_scale 5; step 3: 2/5 of the 5 warm-up batches
  adapter_cfg = json.load(open(f"{folder}/adapter/adapter_config.json"))
  assert adapter_cfg["r"] == 1 and adapter_cfg["base_model_name_or_path"] == warm_policy
  from jaxpod.rl.grpo_task import GRPOTask
  from jaxpod.rl.run import grpo_config, policy_spec
  task = GRPOTask(grpo_config(cfg, folder, policy_spec(cfg, folder)), source=None)
  assert task.updates_per_batch == 1
  default = draccus.parse(RLConfig, args=[*TINY, "--model.hf", warm_policy, "--lora.rank", "1"])
  assert GRPOTask(grpo_config(default, folder, policy_spec(default, folder)), source=None).updates_per_batch == 2
  _, params, buffers = task.abstract_model(0)
  assert all(isinstance(v, nnx.LoRAParam) for _, v in nnx.to_flat_state(params))
  assert not any(isinstance(v, nnx.LoRAParam) for _, v in nnx.to_flat_state(buffers))
  assert param_bytes(buffers) == param_bytes(nnx.state(hf_io.load(warm_policy, make_mesh(devices=jax.devices()[:1]))))
  # what `jaxpod bench rl --lora-rank` reports: the trainer's peak memory, and the train state by part
  summary = json.load(open(f"{folder}/summary.json"))
  assert summary["memory"]["host_peak_rss_bytes"] > param_bytes(buffers)
  from jaxpod.bench.rl.lora import train_state_bytes
  args = [*TINY, "--model.hf", warm_policy, "--trainer.runs_dir", str(tmp_path)]
  full, lora1 = train_state_bytes([*args, "--grpo.beta", "0.05"]), train_state_bytes([*args, "--lora.rank", "1"])
  model = param_bytes(buffers)
  assert (full["params"], full["buffers"]) == (model, model)  # beta > 0: the reference copy
  assert (lora1["params"], lora1["buffers"]) == (param_bytes(params), model)  # the adapters; the base once
  for s in (full, lora1):  # Adam's mu and nu of the trained params (+ its step counters)
    assert 2 * s["params"] <= s["opt_state"] <= 2 * s["params"] + 64 and s["trained"] == s["params"] + s["opt_state"]


def test_lora_b_lr_ratio_scales_only_the_b_updates_of_grpo(tmp_path):
  """`--lora.b_lr_ratio R` (LoRA+) reaches GRPO's optimizer: from the same gradients, every adapter's B moves R
  times as far as its A, on top of the lr x lr_scale both get; the default (1) moves them alike."""
  import draccus
  import jax.numpy as jnp
  from jaxpod.rl.config import RLConfig
  from jaxpod.rl.grpo_task import GRPOTask
  from jaxpod.rl.run import grpo_config
  from tests.rl.clusters import TINY

  base_url = str(tmp_path / "base")
  hf_io.save(init(LLAMA, seed=0), base_url)

  def updates(*flags):
    cfg = draccus.parse(RLConfig, args=[*TINY, "--lora.rank", "1", *flags])
    tx, _ = GRPOTask(grpo_config(cfg, str(tmp_path), PolicySpec(cfg.model, base_url, cfg.lora)), None).optimizer()
    grads = {"lora_a": jnp.full((4, 1), 0.5), "lora_b": jnp.full((1, 4), 0.5)}
    state = tx.init(grads)
    for _ in range(2):  # the first step's lr is 0 (the 5-step warm-up starts at 0)
      out, state = tx.update(grads, state, grads)
    return out
  plain, plus = updates(), updates("--lora.b_lr_ratio", "4")
  assert jnp.allclose(plain["lora_b"], plain["lora_a"][0, 0])
  # lr x lr_scale 5 at update 1 of the warm-up: 5 batches of 2 updates each (LoRA's default grpo.num_iterations)
  assert float(plain["lora_a"][0, 0]) == pytest.approx(-5 * 3e-4 / 10, rel=1e-3)
  assert jnp.allclose(plus["lora_a"], plain["lora_a"]) and jnp.allclose(plus["lora_b"], 4 * plain["lora_b"])


def test_lora_settings_it_cannot_serve_fail_in_one_line():
  """Invariant 7: LoRA without a base to adapt (no model.hf, no warm-up), rank < 1, an unknown target, a
  non-positive lr scale or B lr ratio fail when the config is built, in one line naming the field."""
  from jaxpod.rl.config import RLConfig, RLLoraConfig, WarmupConfig
  for make, field in ((lambda: RLConfig(lora=RLLoraConfig(rank=1), warmup=WarmupConfig(steps=0)), "rl.lora"),
                      (lambda: RLLoraConfig(rank=0), "rank"), (lambda: RLLoraConfig(target_modules=("w1",)), "w1"),
                      (lambda: RLLoraConfig(lr_scale=0), "lr_scale"), (lambda: RLLoraConfig(b_lr_ratio=0), "b_lr_ratio")):
    with pytest.raises(ValueError, match=field) as e:
      make()
    assert "\n" not in str(e.value)
  assert RLConfig(lora=RLLoraConfig(rank=1)).lora.rank == 1  # the warm-up makes the base
