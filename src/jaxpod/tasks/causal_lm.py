"""`causal_lm`: causal-LM training of a Llama on a text file, for the one trainer (`jaxpod.train.task`).

    jaxpod train --config_path configs/lm_tiny.yaml      # task: {type: causal_lm, data, model, optim, sample}

- Tokens: the leader streams the text (`data.text_path`, or the built-in toy-grammar text from
  `jaxpod.data.text`), encodes its lines in batches (BOS from the tokenizer, EOS appended), packs
  them into rows of `seq_len` tokens and writes them once into shared storage as a row store
  (`<data cache>/lm-rows-<key>/`, chunk files with a sha256 each, named by the text, tokenizer and
  seq_len, so a rerun reuses it; `jaxpod.io.rows`); only its URL and the manifest's sha256 travel
  over the control plane (invariant 2). Every host reads only the rows of its share of each batch,
  by byte range, and checks them against their chunk's hash (invariant 10).
- Tokenizer (`data.tokenizer`): `byte` (ids 0..255, BOS 256, EOS 257, PAD 258) or a folder holding a
  `tokenizer.json` trained offline (`jaxpod.models.llama.load_tokenizer`).
- Model: `task.model` (random init; any family's switches, see `models/llama/families/`), or
  `task.hf`, a HF checkpoint of any family whose config.json and weights the run starts from.
- LoRA (`task.lora`, e.g. `--task.lora.rank 8`): adapters (`models/llama/lora.py`) on the attention and
  MLP projections are the state's `params` (the only gradients, optimizer state and EMA); the base is
  frozen in its `buffers`, held once, sharded by its logical axes, trained at LoRA's rule (`jaxpod.policy.lora`:
  task.optim.lr x `task.lora.lr_scale`, B's x `task.lora.b_lr_ratio`; both 1 by default). Off (None) by default.
  `task.adapter` starts them from a PEFT adapter folder (with `task.hf`, its base); the run's
  final EMA adapters are written as PEFT's files to `<run>/adapter` (`peft` loads them on the HF base).
- Loss: mean next-token cross-entropy over the global batch (`models/llama/loss.py`);
  logged as loss and perplexity. AdamW with warmup + cosine, global-norm clipping.
- Eval: held-out rows (the tail of the stream), loss and perplexity with the EMA weights.
- Samples: with `prompts`, a `SampleHook` every `sample_every` steps writes `<run>/samples.jsonl`
  on the leader, with the `sample:` options (`jaxpod sample`'s; greedy by default; its batch size
  is set from the prompts and the mesh; invariant 6: training is unchanged).
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import Callable, Iterator

from typing import ClassVar

import numpy as np

from jaxpod.models.llama.config import LlamaConfig
from jaxpod.models.llama.tokenizer import tokenizer_from
from jaxpod.policy.llama_task import AdamWConfig, LlamaTask, byte_llama
from jaxpod.policy.lora import LoraSection, from_adapter
from jaxpod.policy.spec import start_config
from jaxpod.runtime import storage
from jaxpod.sample.config import SamplingOptions
from jaxpod.train.config import DataConfig, TaskConfig, TrainConfig


@dataclasses.dataclass(frozen=True)
class TextData(DataConfig):
  """The token stream: a text file (or the built-in text), its tokenizer, the row length."""

  global_batch_size: int = 16  # rows per training step over all hosts
  eval_batch_size: int = 32  # rows per evaluation step over all hosts (last batch padded)
  text_path: str | None = None  # a UTF-8 text file (one document per line); None: the built-in toy-grammar text
  text_chars: int = 300_000  # size of the built-in text (ignored with text_path)
  tokenizer: str = "byte"  # "byte" (ids 0..255, BOS 256, EOS 257, PAD 258) or a folder with tokenizer.json
  seq_len: int = 128  # tokens per training row
  eval_fraction: float = 0.05  # share of the rows held out for eval loss / perplexity
  chunk_rows: int = 0  # rows per chunk file of the tokenized corpus, each with its own sha256 (0: ~64 MiB chunks)

  def __post_init__(self):
    super().__post_init__()
    for name in ("seq_len", "text_chars"):
      if getattr(self, name) < 1:
        raise ValueError(f"task.data.{name}={getattr(self, name)}: expected a positive integer")
    if self.chunk_rows < 0:
      raise ValueError(f"task.data.chunk_rows={self.chunk_rows}: expected >= 0 (0: ~64 MiB chunks)")
    if not 0.0 < self.eval_fraction < 1.0:
      raise ValueError(f"task.data.eval_fraction={self.eval_fraction}: expected a value in (0, 1)")


@TaskConfig.register_subclass("causal_lm")
@dataclasses.dataclass(frozen=True)
class CausalLMConfig(TaskConfig):
  """A Llama on a text file: next-token loss, held-out loss/perplexity, samples while training."""

  bar_metrics: tuple[str, ...] = ("loss", "perplexity")
  plot_metrics: tuple[str, ...] = ("loss", "perplexity")
  data: TextData = dataclasses.field(default_factory=TextData)
  model: LlamaConfig = dataclasses.field(default_factory=byte_llama)
  hf: str = ""  # HF checkpoint (folder or URL, any family) to start from; its config.json replaces model
  lora: LoraSection | None = None  # train LoRA adapters only (base frozen), at optim.lr x lora.lr_scale; None: all
  adapter: str = ""  # PEFT adapter (folder or URL) the adapters start from; sets lora's; needs task.hf (its base)
  optim: AdamWConfig = dataclasses.field(default_factory=AdamWConfig)
  sample: SamplingOptions = dataclasses.field(default_factory=SamplingOptions)  # SampleHook's options
  sample_every: int = 0  # SampleHook cadence in steps (0: only at the end; no prompts: no sampling)
  prompts: tuple[str, ...] = ()  # prompts completed by SampleHook into <run>/samples.jsonl

  prefix = "lm"
  old_names: ClassVar[dict[str, str]] = {"init_from": "hf", "adapter_from": "adapter"}  # accepted, warned once

  def model_config(self) -> LlamaConfig:
    """The architecture trained: task.hf's config.json (read through its family; no JAX), else `model`."""
    return start_config(self.hf, self.model, "task.hf")

  def lora_section(self) -> LoraSection | None:
    """The LoRA the run trains (None: every weight): task.lora, or task.adapter's files at task.lora's rates."""
    return from_adapter(self.lora, self.adapter, self.model_config(), base=self.hf, where="task", section=LoraSection)

  def __post_init__(self):
    d, m, smp = self.data, self.model_config(), self.sample
    if d.seq_len > m.max_position_embeddings:
      raise ValueError(f"task.data.seq_len={d.seq_len} exceeds task.model.max_position_embeddings="
                       f"{m.max_position_embeddings}; lower seq_len or raise max_position_embeddings")
    if smp.cache_len > m.max_position_embeddings:
      raise ValueError(f"task.sample.max_prompt_len + task.sample.max_new_tokens = {smp.cache_len} exceeds "
                       f"task.model.max_position_embeddings={m.max_position_embeddings}; lower one of them")
    self.lora_section()  # task.adapter's files against the model: one line naming what does not fit
    if self.sample_every < 0:
      raise ValueError(f"task.sample_every={self.sample_every}: expected >= 0 (0: only at the end)")
    if d.tokenizer == "byte" and m.vocab_size < 259:
      raise ValueError(f"task.model.vocab_size={m.vocab_size} is too small for the byte tokenizer; "
                       "set it to at least 259")

  def check(self, cfg: TrainConfig) -> None:
    if self.optim.warmup_steps >= cfg.trainer.steps:
      raise ValueError(f"task.optim.warmup_steps={self.optim.warmup_steps} must be below trainer.steps="
                       f"{cfg.trainer.steps}")

  def build(self, cfg: TrainConfig) -> "LMTask":
    return LMTask(cfg)


class LMTask(LlamaTask):
  """Next-token loss on a packed text stream; eval = held-out loss/perplexity; SampleHook."""

  name = CausalLMConfig.prefix
  headline = "loss"  # the eval metric logged first
  loss_normalizer = "tokens"  # the loss is a mean over the batch's real tokens
  batch_ndims = {"tokens": 2, "mask": 2}  # mask: real tokens (all ones in training; eval pads its last batch)

  def __init__(self, cfg: TrainConfig):
    self.cfg, self.lm = cfg, cfg.task
    self.lora, self.adapter = self.lm.lora_section(), self.lm.adapter  # LlamaTask's LoRA hooks
    self.llama = self.model_cfg = self.lm.model_config()
    self.start_url = self.lm.hf or None  # task.hf's weights; None: random init
    self.tokenizer = tokenizer_from(self.lm.data.tokenizer)
    self.loader = None

  # ---------------------------------------------------------------- data
  def read_text(self) -> str:
    """The training text (leader only; whole: for tests and small texts, `documents()` streams it)."""
    d = self.lm.data
    if d.text_path:
      return storage.read_text(d.text_path)
    from jaxpod.data.text import grammar_text
    return grammar_text(d.seed, d.text_chars)

  def documents(self) -> Iterator[str]:
    """The training text's lines (leader only), streamed from `data.text_path` or the built-in text."""
    if not self.lm.data.text_path:
      yield from self.read_text().splitlines()
      return
    fs, path = storage.filesystem(self.lm.data.text_path)
    with fs.open(path, "r", encoding="utf-8") as f:
      for line in f:
        yield from line.splitlines()

  def _text_sha256(self) -> str:
    digest = hashlib.sha256()
    if not self.lm.data.text_path:
      digest.update(self.read_text().encode())
      return digest.hexdigest()
    fs, path = storage.filesystem(self.lm.data.text_path)
    with fs.open(path, "rb") as f:
      for block in iter(lambda: f.read(8 << 20), b""):
        digest.update(block)
    return digest.hexdigest()

  def _tokenizer_key(self) -> str:
    if self.lm.data.tokenizer == "byte":
      return "byte"
    return hashlib.sha256(storage.read_bytes(storage.join(self.lm.data.tokenizer, "tokenizer.json"))).hexdigest()

  def prepare(self) -> dict:
    """Leader: tokenize once, in batches, into a row store in shared storage; {"url", "sha256", "tokens"} for
    every host (the manifest's sha256; the tokens in its rows)."""
    from jaxpod.data.text import packed_rows
    from jaxpod.io.rows import RowStore, RowWriter, manifest_sha256
    from jaxpod.train.data import cache_root
    d = self.lm.data
    key = hashlib.sha256(f"{self._tokenizer_key()}\n{self.tokenizer.eos_ids}\n{d.seq_len}\n{self._text_sha256()}"
                         .encode()).hexdigest()
    url = storage.join(cache_root(d, self.cfg.trainer.runs_dir), f"lm-rows-{key[:16]}")
    sha256 = manifest_sha256(url)  # built by an earlier run: reuse it
    if sha256 is None:
      dtype = np.uint16 if self.model_cfg.vocab_size <= 2 ** 16 else np.int32
      writer = RowWriter(url, d.chunk_rows)
      for rows in packed_rows(self._token_batches(self.documents()), d.seq_len):
        writer.append(tokens=rows.astype(dtype))
      if writer.dtype is None:
        raise ValueError(f"task.data: the text gives fewer than seq_len={d.seq_len} tokens; use a longer text or "
                         "lower task.data.seq_len")
      sha256 = writer.close()
    return {"url": url, "sha256": sha256, "tokens": RowStore(url, sha256).num_rows * d.seq_len}

  def _token_batches(self, lines) -> Iterator[np.ndarray]:
    """The lines as int32 token streams, a batch of documents each; ids beyond the model's vocab raise."""
    from jaxpod.data.text import token_batches
    eos = self.tokenizer.eos_ids[0] if self.tokenizer.eos_ids else None
    for tokens in token_batches(lines, self.tokenizer, eos):
      top = int(tokens.max()) if len(tokens) else 0
      if top >= self.model_cfg.vocab_size:
        raise ValueError(f"the tokenizer produced id {top} but task.model.vocab_size={self.model_cfg.vocab_size}; "
                         f"set task.model.vocab_size >= {top + 1}")
      yield tokens

  def tokenize(self, text: str | None = None) -> np.ndarray:
    """The text (default: the configured one) as one token stream, uint16 when the ids fit (one process: tests)."""
    parts = list(self._token_batches(self.documents() if text is None else text.splitlines()))
    tokens = np.concatenate(parts) if parts else np.zeros(0, np.int32)
    top = int(tokens.max()) if len(tokens) else 0
    return tokens.astype(np.uint16) if top < 2 ** 16 else tokens

  def setup(self, prepared: dict, host_index: int, host_count: int) -> None:
    """Every host: a loader reading only this host's rows of the leader's row store (checked by chunk)."""
    from jaxpod.data.text import TextLoader
    from jaxpod.io.rows import RowStore
    d = self.lm.data
    self.loader = TextLoader(RowStore(prepared["url"], prepared["sha256"]), d.seq_len, d.global_batch_size,
                             d.eval_batch_size, eval_fraction=d.eval_fraction, seed=d.seed,
                             shard_index=host_index, shard_count=host_count, pad_id=self.tokenizer.pad_id)

  def train_iter(self):
    return self.loader.train_iter()

  # ---------------------------------------------------------------- model and loss
  def optimizer(self):
    o = self.lm.optim
    return self.optimizer_for(o.lr, lambda lr: o.build(self.cfg.trainer.steps, lr))

  def abstract_batch(self, rows: int, seq_len: int) -> dict:
    """The training batch's shapes (global, unsharded) for `rows` rows of `seq_len` tokens, nothing allocated:
    what `jaxpod plan --compile` lowers this task's step with (no data needed)."""
    import jax
    import jax.numpy as jnp
    return {k: jax.ShapeDtypeStruct((rows, seq_len), jnp.int32) for k in self.batch_ndims}

  def loss_fn(self, graphdef) -> Callable:
    import jax.numpy as jnp
    from jaxpod.models.llama.loss import next_token_loss

    def loss(params, buffers, batch, rng, carry):
      value, sums = next_token_loss(graphdef, self.weights(params, buffers), batch["tokens"], batch["mask"] > 0)
      return value, (carry, {"loss_sum": sums["loss_sum"], "tokens": sums["tokens"].astype(jnp.float32)})

    return loss

  def normalize(self, raw: dict, global_batch: int) -> dict:
    loss = raw["loss_sum"] / max(raw["tokens"], 1.0)
    out = {"loss": loss, "perplexity": math.exp(min(loss, 50.0)), "tokens": raw["tokens"]}
    out.update({k: raw[k] for k in ("lr", "grad_norm") if k in raw})
    return out

  # ---------------------------------------------------------------- eval and hooks
  def evaluator(self, graphdef, mesh, ema_sh, buffer_sh, batch_sh):
    from jax.sharding import NamedSharding, PartitionSpec
    from jaxpod import runtime
    from jaxpod.train.step import global_batch, host_metrics
    loss = self.loss_fn(graphdef)

    def sums(params, buffers, batch):
      _, (_, metrics) = loss(params, buffers, batch, None, ())
      return metrics

    fn = runtime.jit(sums, name="lm_eval_batch", in_shardings=(ema_sh, buffer_sh, batch_sh),
                     out_shardings=NamedSharding(mesh, PartitionSpec()))

    def evaluate(params, buffers) -> dict:
      pending = [fn(params, buffers, global_batch(b, batch_sh)) for b in self.loader.eval_iter()]
      total = tokens = 0.0
      for m in pending:
        h = host_metrics(m)
        total, tokens = total + h["loss_sum"], tokens + h["tokens"]
      loss_value = total / max(tokens, 1.0)
      return {"loss": loss_value, "perplexity": math.exp(min(loss_value, 50.0)), "count": int(tokens)}

    return evaluate

  def hooks(self, graphdef, mesh, tcfg) -> list:
    from jaxpod.sample.hook import sample_hooks
    if self.lora is None:
      return sample_hooks(self.lm, self.tokenizer, graphdef, mesh)
    return [*sample_hooks(self.lm, self.tokenizer, graphdef, mesh,
                          params_of=lambda state: self.weights(state.params, state.buffers)),
            *self.export_hooks(graphdef, None)]  # the adapters as PEFT's files in <run>/adapter

  def eval_summary(self, ev: dict) -> list[tuple[str, str]]:
    return [("eval loss", f"{ev.get('loss', float('nan')):.4f} on {ev.get('count', 0)} held-out tokens"),
            ("eval perplexity", f"{ev.get('perplexity', float('nan')):.3f}")]
