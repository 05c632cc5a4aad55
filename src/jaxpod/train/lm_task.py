"""`LMTask`: causal-LM training of a Llama on a text file, for the one trainer (see `task.py`).

    jaxpod train --config_path configs/lm_tiny.yaml

- Tokens: the leader reads the text (`lm.text_path`, or the built-in toy-grammar text from
  `jaxpod.data.text`), encodes every line with the tokenizer (BOS from the tokenizer, EOS
  appended) and writes the stream once into shared storage (`<data cache>/lm-tokens-<key>.npy`,
  named by the text and tokenizer, so a rerun reuses it); only its URL and sha256 travel over
  the control plane (invariant 2). Every host reads it, checks the hash, packs the same rows.
- Tokenizer: `byte` (ids 0..255, BOS 256, EOS 257, PAD 258) or a folder holding a
  `tokenizer.json` trained offline (`jaxpod.models.llama.load_tokenizer`).
- Loss: mean next-token cross-entropy over the global batch (`models/llama/loss.py`);
  logged as loss and perplexity. AdamW with warmup + cosine, global-norm clipping.
- Eval: held-out rows (the tail of the stream), loss and perplexity with the EMA weights.
- Samples: with `lm.prompts`, a `SampleHook` every `lm.sample_every` steps writes
  `<run>/samples.jsonl` on the leader (greedy by default; invariant 6: training is unchanged).
"""
from __future__ import annotations

import hashlib
import io
import math
from pathlib import Path
from typing import Callable

import numpy as np

from jaxpod.runtime import storage
from jaxpod.train.config import TrainConfig


def _load_tokenizer(spec: str):
  from jaxpod.models.llama.tokenizer import ByteTokenizer, load_tokenizer
  if spec == "byte":
    return ByteTokenizer()
  if not Path(spec).exists():
    raise FileNotFoundError(f"lm.tokenizer={spec!r}: no such folder; use 'byte' or a folder with tokenizer.json")
  return load_tokenizer(spec)


class LMTask:
  """Next-token loss on a packed text stream; eval = held-out loss/perplexity; SampleHook."""

  name = "lm"
  batch_ndims = {"tokens": 2, "mask": 2}  # mask: real tokens (all ones in training; eval pads its last batch)

  def __init__(self, cfg: TrainConfig):
    self.cfg, self.lm = cfg, cfg.lm
    self.tokenizer = _load_tokenizer(self.lm.tokenizer)
    self.loader = None

  # ---------------------------------------------------------------- data
  def read_text(self) -> str:
    """The training text (leader only)."""
    if self.lm.text_path:
      return storage.read_text(self.lm.text_path)
    from jaxpod.data.text import grammar_text
    return grammar_text(self.cfg.data.seed, self.lm.text_chars)

  def _tokenizer_key(self) -> str:
    if self.lm.tokenizer == "byte":
      return "byte"
    return hashlib.sha256(Path(self.lm.tokenizer, "tokenizer.json").read_bytes()).hexdigest()

  def prepare(self) -> dict:
    """Leader: tokenize once into shared storage; returns {"url", "sha256", "tokens"} (what every host receives)."""
    from jaxpod.train.data import cache_root
    text = self.read_text()
    key = hashlib.sha256(f"{self._tokenizer_key()}\n{self.tokenizer.eos_ids}\n".encode() + text.encode()).hexdigest()
    url = storage.join(cache_root(self.cfg.data, self.cfg.trainer.runs_dir), f"lm-tokens-{key[:16]}.npy")
    if not storage.exists(url):
      buf = io.BytesIO()
      np.save(buf, self.tokenize(text), allow_pickle=False)
      storage.write_bytes(url, buf.getvalue())
    blob = storage.read_bytes(url)
    return {"url": url, "sha256": hashlib.sha256(blob).hexdigest(), "tokens": int(np.load(io.BytesIO(blob)).size)}

  def tokenize(self, text: str | None = None) -> np.ndarray:
    """The text (default: `read_text()`) as one token stream, uint16 when the ids fit."""
    from jaxpod.data.text import tokenize_documents
    eos = self.tokenizer.eos_ids[0] if self.tokenizer.eos_ids else None
    tokens = tokenize_documents(self.read_text() if text is None else text, self.tokenizer.encode, eos)
    top = int(tokens.max()) if len(tokens) else 0
    if top >= self.lm.model.vocab_size:
      raise ValueError(f"the tokenizer produced id {top} but lm.model.vocab_size={self.lm.model.vocab_size}; "
                       f"set lm.model.vocab_size >= {top + 1}")
    return tokens.astype(np.uint16) if top < 2 ** 16 else tokens

  def setup(self, prepared: dict, host_index: int, host_count: int) -> None:
    from jaxpod.data.text import TextLoader
    blob = storage.read_bytes(prepared["url"])
    if hashlib.sha256(blob).hexdigest() != prepared["sha256"]:
      raise ValueError(f"{prepared['url']} changed since the leader wrote it (sha256 differs); another run is "
                       "writing the same data cache? rerun, or set data.cache_dir to a folder of this run's own")
    tokens = np.load(io.BytesIO(blob), allow_pickle=False)
    d = self.cfg.data
    self.loader = TextLoader(np.asarray(tokens, np.int32), self.lm.seq_len, d.global_batch_size,
                             d.eval_batch_size, eval_fraction=self.lm.eval_fraction, seed=d.seed,
                             shard_index=host_index, shard_count=host_count, pad_id=self.tokenizer.pad_id)

  def train_iter(self):
    return self.loader.train_iter()

  # ---------------------------------------------------------------- model and loss
  def abstract_model(self, seed: int):
    from flax import nnx
    from jaxpod.models.llama import abstract
    graphdef, params = nnx.split(abstract(self.lm.model))
    return graphdef, params, {}

  def init_model(self, seed: int):
    from flax import nnx
    from jaxpod.models.llama import Llama
    return nnx.split(Llama(self.lm.model, rngs=nnx.Rngs(params=seed)))[1], {}

  def init_carry(self, global_batch: int):
    return ()

  def optimizer(self):
    import jax
    import optax
    lm, steps = self.lm, self.cfg.trainer.steps
    sched = optax.warmup_cosine_decay_schedule(0.0, lm.lr, lm.warmup_steps, steps, end_value=lm.lr * lm.lr_min_ratio)
    decay_mask = lambda params: jax.tree.map(lambda x: x.ndim > 1, params)  # no decay on norm weights
    adamw = optax.adamw(sched, b1=0.9, b2=0.95, weight_decay=lm.weight_decay, mask=decay_mask)
    tx = optax.chain(optax.clip_by_global_norm(lm.grad_clip), adamw) if lm.grad_clip else adamw
    return tx, sched

  def loss_fn(self, graphdef) -> Callable:
    import jax.numpy as jnp
    from jaxpod.models.llama.loss import next_token_loss

    def loss(params, buffers, batch, rng, carry):
      value, sums = next_token_loss(graphdef, params, batch["tokens"], batch["mask"] > 0)
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
    if not self.lm.prompts:
      return []
    from jaxpod.sample.config import EngineConfig, SamplingParams
    from jaxpod.sample.hook import SampleHook
    dp = math.prod(mesh.shape[a] for a in mesh.axis_names if a in ("data", "fsdp"))
    rows = -(-len(self.lm.prompts) // dp) * dp
    engine = EngineConfig(batch_size=rows, max_prompt_len=self.lm.sample_max_prompt_len,
                          max_new_tokens=self.lm.sample_max_new_tokens)
    hook = SampleHook(self.lm.sample_every, self.lm.prompts, self.tokenizer, graphdef, engine=engine,
                      sampling=SamplingParams(temperature=self.lm.sample_temperature), seed=tcfg.seed)
    longest = max(len(ids) for ids in hook._prompt_ids())  # leader tokenizes, every host gets the ids: now
    if longest > self.lm.sample_max_prompt_len:          # (before training), not at the first sampling step
      raise ValueError(f"lm.prompts: a prompt has {longest} tokens but lm.sample_max_prompt_len="
                       f"{self.lm.sample_max_prompt_len}; raise it or shorten the prompt")
    return [hook]

  def eval_summary(self, ev: dict) -> list[tuple[str, str]]:
    return [("eval loss", f"{ev.get('loss', float('nan')):.4f} on {ev.get('count', 0)} held-out tokens"),
            ("eval perplexity", f"{ev.get('perplexity', float('nan')):.3f}")]
