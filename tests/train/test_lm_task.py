"""The causal-LM task in the one trainer: it learns, SampleHook leaves it untouched, lm_tiny.yaml parses."""
import json
from pathlib import Path

import numpy as np
import pytest

from jaxpod.train import train

REPO = Path(__file__).resolve().parents[2]


def _lm_args(runs_dir, name: str, steps: int = 30, **overrides) -> list[str]:
  """`jaxpod train` arguments for a tiny byte-level Llama on a short built-in text."""
  values = {
      "task.data.global_batch_size": 16, "task.data.eval_batch_size": 16, "task.data.text_chars": 40000,
      "task.data.seq_len": 32, "task.model.hidden_size": 32, "task.model.intermediate_size": 64,
      "task.model.num_hidden_layers": 2, "task.model.num_attention_heads": 2, "task.model.num_key_value_heads": 1,
      "task.optim.lr": 1e-2, "task.optim.warmup_steps": 3, "task.sample.max_new_tokens": 8,
      "trainer.steps": steps, "trainer.log_every": 1, "trainer.ema": 0.5, "trainer.run_name": name,
      "trainer.runs_dir": str(runs_dir), "trainer.progress": "false", "trainer.plot": "false",
      "tracker.tensorboard": "false",
  }
  values.update({k.replace("__", "."): v for k, v in overrides.items()})
  return ["--config_path", str(REPO / "configs" / "lm_tiny.yaml")] + [f"--{k}={v}" for k, v in values.items()]


def _lm_config(runs_dir, name: str, steps: int = 30, **overrides):
  """The TrainConfig of `_lm_args`, parsed as `jaxpod train` parses it."""
  from jaxpod.cli.args import parse
  from jaxpod.train import TrainConfig
  return parse(TrainConfig, _lm_args(runs_dir, name, steps, **overrides), "test")


def _losses(run_dir) -> list[tuple[int, float, float]]:
  from jaxpod.runtime import storage
  recs = [json.loads(l) for l in storage.read_text(storage.join(run_dir, "metrics.jsonl")).splitlines()]
  return [(r["step"], r["loss"], r["grad_norm"]) for r in recs if "loss" in r]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """The same tiny LM run without prompts and with a SampleHook every 2 steps."""
  root = tmp_path_factory.mktemp("lm_runs")
  plain = train(_lm_config(root, "plain", task__prompts="[]"))
  hooked = train(_lm_config(root, "hooked", task__sample_every=2, task__prompts='["The old king", "A kind"]'))
  return plain, hooked


@pytest.mark.slow
def test_lm_task_learns(runs):
  """Next-token loss drops well below the uniform byte loss (ln 259 = 5.56) within 30 steps; eval too."""
  plain, _ = runs
  losses = [loss for _, loss, _ in _losses(plain.run_dir)]
  assert len(losses) == 30
  first, last = np.mean(losses[:3]), np.mean(losses[-3:])
  assert last < first - 1.5, (first, last)
  assert plain.eval["loss"] < 3.5 and plain.eval["count"] > 0 and np.isfinite(plain.eval["perplexity"])


@pytest.mark.slow
def test_sample_hook_leaves_lm_training_bit_identical(runs):
  """Invariant 6: a SampleHook every 2 steps changes neither the loss sequence nor the final parameters."""
  import orbax.checkpoint as ocp
  plain, hooked = runs
  assert _losses(hooked.run_dir) == _losses(plain.run_dir)  # exact float equality, every step

  def final_state(run_dir):
    with ocp.CheckpointManager(Path(run_dir, "checkpoints")) as mgr:
      return mgr.restore(30, args=ocp.args.Composite(state=ocp.args.StandardRestore()))["state"]

  import jax
  a, b = jax.tree.leaves(final_state(plain.run_dir)), jax.tree.leaves(final_state(hooked.run_dir))
  assert len(a) == len(b) > 0
  for x, y in zip(a, b):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  rows = [json.loads(l) for l in Path(hooked.run_dir, "samples.jsonl").read_text().splitlines()]
  assert sorted({r["step"] for r in rows}) == list(range(2, 31, 2)) and {r["index"] for r in rows} == {0, 1}
  assert not Path(plain.run_dir, "samples.jsonl").exists()


def test_lm_tiny_yaml_parses():
  """`jaxpod train --config_path configs/lm_tiny.yaml`: the LM task, byte-level, with sampling prompts."""
  from jaxpod.cli.train import load_config
  from jaxpod.train.task import make_task
  cfg = load_config(["--config_path", str(REPO / "configs" / "lm_tiny.yaml")])
  assert cfg.task.data.tokenizer == "byte" and cfg.task.model.hidden_size == 128
  assert cfg.task.model.eos_token_id == (257,) and cfg.task.prompts and cfg.task.sample_every > 0
  assert type(make_task(cfg)).__name__ == "LMTask"


def test_text_loader_batches_do_not_depend_on_host_count():
  """Invariant: the global batch of step k is the same rows for 1 or 2 hosts, and resuming needs only the step."""
  from jaxpod.data.text import TextLoader, grammar_text, tokenize_documents
  from jaxpod.models.llama import ByteTokenizer
  tok = ByteTokenizer()
  text = grammar_text(3, 20000)
  assert text == grammar_text(3, 20000)
  tokens = tokenize_documents(text, tok.encode, tok.eos_ids[0])
  one = TextLoader(tokens, 32, 8, 8, seed=1)
  two = [TextLoader(tokens, 32, 8, 8, seed=1, shard_index=i, shard_count=2) for i in range(2)]
  it = one.train_iter()
  for step in range(2 * one.steps_per_epoch + 1):
    whole = next(it)["tokens"]
    np.testing.assert_array_equal(whole, np.concatenate([t.train_batch(step)["tokens"] for t in two]))
  resumed = one.train_iter()
  resumed.set_state(it.get_state())
  np.testing.assert_array_equal(next(resumed)["tokens"], next(it)["tokens"])
  evals = list(one.eval_iter())
  assert sum(int(b["mask"][:, 0].sum()) for b in evals) == len(one.eval_rows)


@pytest.mark.slow
@pytest.mark.multihost
def test_lm_task_on_two_hosts_matches_one_host(launch_hosts, bucket):
  """Invariants 1, 2, 6, 8 for the LM task on isolated hosts sharing a bucket: the leader tokenizes a corpus
  100x the other tests' into the bucket and only its URL and hash cross the control plane (every KV value
  < 64 KB on every host); 1 host x 1 device and 2 hosts x 2 devices train on the same global batches (same
  losses up to reduction order); the SampleHook runs on every host, only the leader writes samples.jsonl."""
  from jaxpod.runtime import storage
  from tests.conftest import host_lines
  worker = Path(__file__).parent / "workers" / "train_worker.py"
  runs = {}
  for hosts, dph in ((1, 1), (2, 2)):
    args = _lm_args(storage.join(bucket, "runs"), f"h{hosts}", steps=4, task__sample_every=2,
                    task__prompts='["The old king", "A kind"]', task__data__text_chars=4_000_000,
                    task__data__eval_fraction=0.001)  # the usual ~8 eval batches, not 400
    r = launch_hosts(worker, hosts=hosts, devices_per_host=dph, args=["run", *args])
    assert r.returncode == 0, r.transcript
    runs[hosts] = json.loads(host_lines(r, 0, "SUMMARY")[0])
    for h in range(hosts):
      assert int(host_lines(r, h, "KVMAX")[0]) < 64 * 1024, r.transcript
  one, two = (_losses(runs[h]["run_dir"]) for h in (1, 2))
  assert [s for s, _, _ in one] == [s for s, _, _ in two] == [1, 2, 3, 4]
  np.testing.assert_allclose([l for _, l, _ in two], [l for _, l, _ in one], rtol=2e-4)
  assert runs[1]["eval"]["count"] == runs[2]["eval"]["count"] > 0
  samples = storage.read_text(storage.join(runs[2]["run_dir"], "samples.jsonl"))
  rows = [json.loads(l) for l in samples.splitlines()]
  assert [(r["step"], r["index"]) for r in rows] == [(2, 0), (2, 1), (4, 0), (4, 1)]


@pytest.mark.slow
def test_lm_task_with_a_bpe_tokenizer_trained_offline(tmp_path):
  """`task.data.tokenizer: FOLDER` (a tokenizer.json trained offline with `tokenizers`): ids within the model's vocab,
  BOS/EOS per line, training runs and SampleHook decodes its completions with that tokenizer."""
  from jaxpod.data.text import grammar_text, train_bpe_tokenizer
  from jaxpod.tasks.causal_lm import LMTask
  folder = train_bpe_tokenizer(grammar_text(0, 40000), 384, str(tmp_path / "tok"))
  overrides = dict(task__data__tokenizer=folder, task__model__vocab_size=384, task__model__bos_token_id=1,
                   task__model__eos_token_id="[2]", task__model__pad_token_id=0)
  cfg = _lm_config(tmp_path, "bpe", steps=4, task__sample_every=2, task__prompts='["The old king"]', **overrides)
  tokens = LMTask(cfg).tokenize()
  assert tokens.max() < 384 and tokens[0] == 1 and (tokens == 2).sum() == (tokens == 1).sum() > 10
  summary = train(cfg)
  assert len(_losses(summary.run_dir)) == 4 and np.isfinite(summary.eval["loss"])
  rows = [json.loads(l) for l in Path(summary.run_dir, "samples.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows] == [2, 4] and all(isinstance(r["completion"], str) for r in rows)
  assert all(0 <= i < 384 for r in rows for i in r["token_ids"])


@pytest.mark.slow
def test_lm_run_interrupted_and_resumed_equals_uninterrupted(tmp_path):
  """Invariant 5 for the LM task: stop at step 5 (checkpoint at 3), rerun -> the checkpointed data position
  resumes the same batches, so the loss sequence equals the uninterrupted run's exactly."""
  from jaxpod.train import Hook

  class Stop(Hook):
    every = 1

    def __call__(self, info):
      if info.step == 5:
        raise KeyboardInterrupt("stop")

  full = train(_lm_config(tmp_path, "full", steps=8, trainer__checkpoint_every=3, task__prompts="[]"))
  with pytest.raises(KeyboardInterrupt):
    train(_lm_config(tmp_path, "cut", steps=8, trainer__checkpoint_every=3, task__prompts="[]"), extra_hooks=[Stop()])
  again = train(_lm_config(tmp_path, "cut", steps=8, trainer__checkpoint_every=3, task__prompts="[]"))
  assert again.resumed and again.start_step == 3
  assert _losses(again.run_dir) == _losses(full.run_dir)


def test_lm_task_reads_a_text_file_and_rejects_ids_beyond_the_vocab(tmp_path):
  """`task.data.text_path`: every non-empty line is one document (BOS ... EOS); an id the model cannot embed is an
  error naming task.model.vocab_size, raised on the leader before any training."""
  from jaxpod.tasks.causal_lm import LMTask
  path = tmp_path / "t.txt"
  path.write_text("ab\n\nc\n", encoding="utf-8")
  tokens = LMTask(_lm_config(tmp_path, "f", task__data__text_path=str(path))).tokenize()
  assert tokens.tolist() == [256, 97, 98, 257, 256, 99, 257]
  with pytest.raises(ValueError, match="task.model.vocab_size"):
    LMTask(_lm_config(tmp_path, "f", task__data__text_path=str(path), task__data__tokenizer=str(_bpe(tmp_path)),
                      task__model__vocab_size=3)).tokenize()  # BPE ids run to 299: a 3-row embedding cannot hold them


def _bpe(tmp_path):
  from jaxpod.data.text import grammar_text, train_bpe_tokenizer
  return train_bpe_tokenizer(grammar_text(0, 5000), 300, str(tmp_path / "tok_small"))


@pytest.mark.parametrize("family", ["gemma3_text"])
def test_lm_task_fine_tunes_a_family_checkpoint(hf_family, family, tmp_path, capsys):
  """task.hf: the run trains the checkpoint's own architecture (Gemma 3: sliding layers over 32-token rows,
  window 8) from its weights: its first loss is that of the checkpoint (near-uniform, ln 300 = 5.7), and it learns."""
  folder, _ = hf_family(family)
  cfg = _lm_config(tmp_path, "ft", steps=8, task__hf=folder)
  assert cfg.task.model_config().model_type == family
  result = train(cfg)
  losses = [loss for _, loss, _ in _losses(result.run_dir)]
  assert abs(losses[0] - np.log(300)) < 0.2 and losses[-1] < losses[0] - 0.5, losses
  with pytest.raises(SystemExit):
    _lm_config(tmp_path, "bad", task__hf=str(tmp_path / "nothing"))
  assert "task.hf=" in capsys.readouterr().err
