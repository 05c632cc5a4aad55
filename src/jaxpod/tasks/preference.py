"""`preference`: SimPO, DPO (cDPO label smoothing) and IPO on preference pairs, for the one trainer.

    jaxpod train --task.type preference                          # built-in default: SimPO on sort pairs, minutes here
    jaxpod train --task.type preference --task.loss.kind dpo --task.loss.beta 0.1
    jaxpod train --config_path configs/preference_hf.yaml        # a HF checkpoint and a chat-format pair file
    jaxpod train --task.type preference --task.lora.rank 8       # LoRA: adapters only, lr by loss (task.lora.lr_scale)

- Pairs: one row per pair, `tokens` and `answer` [P, 2, L] (chosen, rejected side by side, so both sides
  of a pair live on one host and go through the model in ONE forward of [2P, L]). `answer` marks the
  answer's tokens (EOS included); the prompt never counts. Losses sum (DPO) or average (SimPO, IPO)
  over those tokens as each defines (`preference_loss.py`).
- Data: `data.path` names a file HF `datasets` reads (JSONL, Parquet, Arrow; local or gs://), read by
  the leader, tokenized once into shared storage (`jaxpod.data.preference_files`) as a row store
  (chunks with a sha256 each, `jaxpod.io.rows`); every host reads only its rows of each batch, by
  byte range, and checks them against their chunk's hash (invariant 10). Without `data.path`, the built-in default makes its
  pairs itself (`preference_start.py`): a small Llama imitates a flawed digit-sorting teacher (the policy's
  warm-up, `jaxpod rl`'s too: a trainer run in the data cache, a preempted rerun resumes it), then
  its own wrong samples become the rejected answers and the verifier's answers the chosen ones.
- Reference (DPO, IPO): `reference: in_step` (default) keeps the starting weights as a frozen copy
  in the state's `buffers` (sharded exactly like the policy, rebuilt from the starting weights on resume
  rather than checkpointed (`train.rebuilt`), never seen by the
  optimizer, which only receives the gradient of `params`) and runs one extra forward per step;
  `precomputed` runs the reference once over every pair before training, stores the [N, 2] log-probs
  beside the pairs in shared storage and frees the weights. See docs/DESIGN.md for the memory each costs.
  With `task.lora` (`preference_lora.py`) the state holds the adapters (trained) and the base (frozen) once;
  the in-step reference is that base with the adapters off, so there is no reference copy.
- Eval: the loss and TRL's reward metrics on held-out pairs; for the built-in default also held-out
  greedy exact match (`eval/accuracy`), whose first and last values summary.json reports as
  `accuracy.start` / `accuracy.end`. Samples: `prompts` + `sample_every` add a SampleHook (invariant 6).
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
from typing import Callable

import numpy as np

from jaxpod.data.pairs import open_pairs, write_pairs
from typing import ClassVar

from jaxpod.models.llama.config import LlamaConfig
from jaxpod.models.llama.tokenizer import tokenizer_from
from jaxpod.policy.llama_task import AdamWConfig, LlamaTask, byte_llama
from jaxpod.policy.spec import start_config
from jaxpod.runtime import storage
from jaxpod.sample.config import SamplingOptions
from jaxpod.tasks import preference_lora
from jaxpod.tasks.preference_lora import PreferenceLora
from jaxpod.tasks.preference_loss import METRICS, LossConfig
from jaxpod.train.config import DataConfig, TaskConfig, TrainConfig

REFERENCE_MODES = ("in_step", "precomputed")


@dataclasses.dataclass(frozen=True)
class PairData(DataConfig):
  """Where the pairs come from and how they are cut to length."""

  global_batch_size: int = 64  # pairs per training step over all hosts
  eval_batch_size: int = 64  # held-out pairs per evaluation step over all hosts (last batch padded)
  path: str | None = None  # pair file (.jsonl/.json, .parquet, .arrow; local or gs://); None: the built-in sort pairs
  tokenizer: str = ""  # "byte" or a folder with tokenizer.json (+ chat template); "": task.hf's own, else byte
  max_prompt_length: int = 16  # prompt tokens kept (a longer prompt keeps its end, as TRL does)
  max_length: int = 24  # prompt + answer tokens per side (a longer answer loses its end)
  eval_pairs: int = 128  # pairs held out for the eval/ metrics (never trained on)
  max_bad_fraction: float = 0.05  # refuse to start when a larger share of the file's rows is bad

  def __post_init__(self):
    super().__post_init__()
    if not 1 <= self.max_prompt_length < self.max_length:
      raise ValueError(f"task.data.max_prompt_length={self.max_prompt_length} must be in 1..max_length-1="
                       f"{self.max_length - 1} (the answer needs at least one token)")
    if self.eval_pairs < 1:
      raise ValueError(f"task.data.eval_pairs={self.eval_pairs}: expected >= 1")
    if not 0.0 <= self.max_bad_fraction < 1.0:
      raise ValueError(f"task.data.max_bad_fraction={self.max_bad_fraction}: expected a value in [0, 1)")


@dataclasses.dataclass(frozen=True)
class SortPairs:
  """The built-in default (no data.path): sort digits; a flawed teacher; on-policy rejected answers."""

  length: int = 6  # digits per problem
  teacher_dedup: float = 0.7  # the teacher drops each repeated digit with this probability (the habit)
  warmup_steps: int = 150  # supervised imitation of the teacher before preference training (the start and reference)
  warmup_batch: int = 128  # problems per warm-up step
  warmup_lr: float = 1e-3  # warm-up AdamW learning rate (linear warm-up over its first 10%)
  warmup_grad_clip: float = 0.0  # warm-up global-norm clip (0: none; `jaxpod rl`'s warm-up clips at 1.0)
  prompts: int = 2048  # training prompts sampled once from the warm-up policy (a pair each with a habit to correct)
  temperature: float = 1.0  # temperature of those samples
  extra_repeat_pairs: bool = True  # also one pair per prompt whose rejected answer repeats a digit once too often
  # (a verifier-made negative: on-policy pairs alone only ever say "more repeats", and the policy overshoots)
  eval_size: int = 256  # held-out problems for eval/accuracy (greedy exact match)

  def __post_init__(self):
    if not 2 <= self.length <= 16 or not 0.0 <= self.teacher_dedup <= 1.0:
      raise ValueError(f"task.sort: length={self.length} must be in 2..16 and teacher_dedup={self.teacher_dedup} "
                       "in [0, 1]")
    if min(self.warmup_batch, self.prompts, self.eval_size) < 1 or min(self.warmup_steps, self.warmup_grad_clip) < 0:
      raise ValueError("task.sort.warmup_batch, prompts, eval_size must be >= 1 and warmup_steps, warmup_grad_clip "
                       ">= 0")


def _default_model() -> LlamaConfig:
  """causal_lm's byte-level Llama with 2 layers and a 64-token context (the sort pairs need 21)."""
  return dataclasses.replace(byte_llama(), num_hidden_layers=2, max_position_embeddings=64)


@TaskConfig.register_subclass("preference")
@dataclasses.dataclass(frozen=True)
class PreferenceConfig(TaskConfig):
  """Preference optimisation of a Llama: SimPO (default), DPO or IPO on pairs."""

  bar_metrics: tuple[str, ...] = ("loss", "rewards/accuracies", "rewards/margins")
  plot_metrics: tuple[str, ...] = ("loss", "rewards/accuracies", "rewards/margins", "accuracy")
  data: PairData = dataclasses.field(default_factory=PairData)
  model: LlamaConfig = dataclasses.field(default_factory=_default_model)  # ignored with hf (its config.json wins)
  hf: str = ""  # HF Llama checkpoint (folder or URL) the policy (and the reference) start from; "": sort warm-up / init
  loss: LossConfig = dataclasses.field(default_factory=LossConfig)
  reference: str = "in_step"  # DPO/IPO reference: in_step (frozen copy in the state) | precomputed (once, stored)
  lora: PreferenceLora | None = None  # train LoRA adapters only (base frozen, reference = adapters off); None: all
  adapter: str = ""  # PEFT adapter (folder or URL) the adapters start from; sets lora's; needs task.hf (its base)
  optim: AdamWConfig = dataclasses.field(default_factory=lambda: AdamWConfig(lr=3e-4, warmup_steps=10,
                                                                             weight_decay=0.0))
  sort: SortPairs = dataclasses.field(default_factory=SortPairs)
  sample: SamplingOptions = dataclasses.field(default_factory=lambda: SamplingOptions(max_prompt_len=16,
                                                                                      max_new_tokens=8))
  sample_every: int = 0  # SampleHook cadence in steps (0: only at the end; no prompts: no sampling)
  prompts: tuple[str, ...] = ()  # prompts completed by SampleHook into <run>/samples.jsonl

  prefix = "pref"
  old_names: ClassVar[dict[str, str]] = {"adapter_from": "adapter", "lora_lr_scale": "lora.lr_scale",
                                         "lora_b_lr_ratio": "lora.b_lr_ratio"}  # accepted, warned once

  def __post_init__(self):
    if self.reference not in REFERENCE_MODES:
      raise ValueError(f"task.reference={self.reference!r}: expected one of {', '.join(REFERENCE_MODES)}")
    if self.sample_every < 0:
      raise ValueError(f"task.sample_every={self.sample_every}: expected >= 0 (0: only at the end)")
    if not self.hf and self.data.max_length > self.model.max_position_embeddings:
      raise ValueError(f"task.data.max_length={self.data.max_length} exceeds task.model.max_position_embeddings="
                       f"{self.model.max_position_embeddings}; lower one or raise the other")
    if self.data.path is None and not self.hf and self.data.max_length < 2 * self.sort.length + 9:
      raise ValueError(f"task.data.max_length={self.data.max_length} is too short for sort pairs of "
                       f"{self.sort.length} digits; use at least {2 * self.sort.length + 9}")
    if self.data.path is None and self.hf:
      raise ValueError("task.hf is set but task.data.path is not: the built-in sort pairs need the byte-level "
                       "warm-up policy; give a pair file with task.data.path")
    preference_lora.check(self)

  def check(self, cfg: TrainConfig) -> None:
    if self.optim.warmup_steps >= cfg.trainer.steps:
      raise ValueError(f"task.optim.warmup_steps={self.optim.warmup_steps} must be below trainer.steps="
                       f"{cfg.trainer.steps}")

  def shared_urls(self) -> dict[str, str]:
    """The data cache and the starting checkpoint: every host reads them (invariant 8: a bucket with several hosts)."""
    urls = {**super().shared_urls(), **({"task.hf": self.hf} if self.hf else {})}
    return {**urls, **({"task.adapter": self.adapter} if self.adapter else {})}

  @property
  def in_step_reference(self) -> bool:
    """Whether the state carries the frozen reference weights (DPO/IPO with reference: in_step)."""
    return self.loss.needs_reference and self.reference == "in_step"

  def build(self, cfg: TrainConfig) -> "PreferenceTask":
    return PreferenceTask(cfg)


def _sha(obj) -> str:
  return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


class PreferenceTask(LlamaTask):
  """Pairs through one forward, the configured preference loss, held-out pair metrics (+ exact match)."""

  name = PreferenceConfig.prefix
  headline = "loss"
  loss_normalizer = "pairs"  # the loss is a mean over the batch's valid pairs

  def __init__(self, cfg: TrainConfig):
    self.cfg, self.pc = cfg, cfg.task
    self.lora, self.adapter = preference_lora.section(self.pc), self.pc.adapter  # LlamaTask's LoRA hooks
    self.tokenizer_dir = self.pc.data.tokenizer or self.pc.hf or "byte"
    self.tokenizer = tokenizer_from(self.tokenizer_dir)
    self.llama = start_config(self.pc.hf, self.pc.model, "task.hf")
    self.batch_ndims = {"tokens": 3, "answer": 3}
    if self.pc.loss.needs_reference and self.pc.reference == "precomputed":
      self.batch_ndims["ref"] = 2  # [P, 2] reference log-probs stored beside the pairs
    self.loader = None
    self.start_url = self.pc.hf or None  # the weights the policy and the reference start from
    self.pair_counts: dict = {}

  # ---------------------------------------------------------------- data
  def _cache(self) -> str:
    from jaxpod.train.data import cache_root
    return cache_root(self.pc.data, self.cfg.trainer.runs_dir)

  def prepare(self) -> dict:
    """Leader: a pair file is read and tokenized once into shared storage; the default's pairs are made in setup."""
    d = self.pc.data
    if d.path is None:
      return {"sort_key": _sha([dataclasses.asdict(self.pc.sort), dataclasses.asdict(self.pc.model), d.max_length,
                                d.max_prompt_length, self.cfg.trainer.seed, "rl_warmup"])}  # the warm-up run (key kept)
    from jaxpod.data.preference_files import read_pair_file
    from jaxpod.io.rows import manifest_sha256
    if not storage.exists(d.path):
      raise FileNotFoundError(f"task.data.path={d.path}: no such file; give a .jsonl, .parquet or .arrow pair file")
    key = _sha([d.path, hashlib.sha256(storage.read_bytes(d.path)).hexdigest(), d.max_prompt_length, d.max_length,
                d.max_bad_fraction, self.tokenizer_dir])
    url = storage.join(self._cache(), f"pref-pairs-{key}")
    report_url = url + ".report.json"
    sha256 = manifest_sha256(url)  # tokenized by an earlier run: only its hash is needed here
    if sha256 is None:
      template = tokens = None
      if self.tokenizer_dir != "byte":
        from jaxpod.data.chat import load_chat_template, load_special_tokens
        template, tokens = load_chat_template(self.tokenizer_dir), load_special_tokens(self.tokenizer_dir)
      arrays, report = read_pair_file(d.path, self.tokenizer, d.max_prompt_length, d.max_length, d.max_bad_fraction,
                                      chat_template=template, special_tokens=tokens)
      storage.write_text(report_url, json.dumps(report))
      sha256 = write_pairs(url, arrays)
    return {"url": url, "sha256": sha256, "report": json.loads(storage.read_text(report_url))}

  def setup(self, prepared: dict, host_index: int, host_count: int) -> None:
    """Every host: the pairs (the default makes them here, SPMD), the precomputed reference, this host's loader
    (which reads only this host's rows of each batch)."""
    from jaxpod import runtime
    from jaxpod.data.pairs import PairLoader
    from jaxpod.io.rows import WithColumns
    if "sort_key" in prepared:
      rows = self._sort_pairs(self.sort_folder(prepared))
    else:
      rows = open_pairs(prepared["url"], prepared["sha256"])
      self.pair_counts = prepared["report"]
    if "ref" in self.batch_ndims:
      rows = WithColumns(rows, {"ref": self._reference(prepared.get("url") or self.start_url, rows)})
    eval_pairs = min(self.pc.data.eval_pairs, rows.num_rows // 4)
    self.loader = PairLoader(rows, self.pc.data.global_batch_size, eval_pairs, seed=self.pc.data.seed,
                             shard_index=host_index, shard_count=host_count)
    if runtime.is_leader():
      from jaxpod.runtime.log import get_logger
      get_logger("preference").info("%d training pairs, %d held out (%s)", self.loader.num_train, eval_pairs,
                                    self.pair_counts)

  def sort_folder(self, prepared: dict) -> str:
    """The built-in default's folder in the data cache: its warm-up run (`warmup/`, exported to `warmup/hf`), pairs."""
    return storage.join(self._cache(), f"pref-sort-{prepared['sort_key']}")

  def _mesh(self):
    from jaxpod import runtime
    return runtime.mesh_from_config(self.cfg.mesh)

  def _sort_pairs(self, folder: str):
    """The default's warm-up (a trainer run in `<folder>/warmup`, resumed when preempted; its HF export the start)
    and pairs in shared storage; made by every host when missing."""
    from jaxpod import runtime
    from jaxpod.tasks import preference_start as start
    from jaxpod.train.trainer import train
    d, sort, seed = self.pc.data, self.pc.sort, self.cfg.trainer.seed
    warm, pairs = storage.join(folder, "warmup", "hf"), storage.join(folder, "pairs")
    if not runtime.broadcast_call(lambda: storage.exists(storage.join(warm, "config.json")), "pref.has_warmup"):
      if sort.warmup_steps:
        train(start.warmup_config(self.cfg, folder))
      else:  # no warm-up: the random init of trainer.seed is the start
        from flax import nnx
        from jaxpod.models.llama import Llama, hf_io
        hf_io.save(Llama(self.llama, rngs=nnx.Rngs(params=seed)), warm)
        runtime.barrier("pref.init_saved", timeout_s=600)
    self.start_url = warm
    if not runtime.broadcast_call(lambda: storage.exists(storage.join(pairs, "manifest.json")), "pref.has_pairs"):
      mesh = self._mesh()
      graphdef, params = self.load_params(warm, mesh)
      arrays, counts = start.sort_pairs(graphdef, params, mesh, sort, self.tokenizer, seed, d.max_length)
      runtime.broadcast_call(lambda: (write_pairs(pairs, arrays),
                                      storage.write_text(pairs + ".counts.json", json.dumps(counts))), "pref.pairs")
    self.pair_counts = json.loads(storage.read_text(pairs + ".counts.json"))
    return open_pairs(pairs)

  def _reference(self, key_url: str | None, rows) -> np.ndarray:
    """[N, 2] reference log-probs of every pair, computed once (every host, over every pair) and stored beside
    the pairs; 8 bytes a pair, so every host holds them whole."""
    from jaxpod import runtime
    from jaxpod.tasks.preference_start import reference_logps
    if not self.start_url:
      raise ValueError("task.reference=precomputed needs starting weights (task.hf, or the built-in default's "
                       "warm-up); with a random init use task.reference=in_step")
    shape = (rows.num_rows, *rows.dtype["tokens"].shape)
    url = storage.join(self._cache(), f"pref-ref-{_sha([key_url, self.start_url, shape, self.pc.adapter])}.npy")
    if not runtime.broadcast_call(lambda: storage.exists(url), "pref.has_reference"):
      mesh = self._mesh()
      graphdef, params = preference_lora.start_weights(self, mesh)
      ref = reference_logps(graphdef, params, rows.read_all(), mesh, self.pc.data.global_batch_size)
      buf = io.BytesIO()
      np.save(buf, ref, allow_pickle=False)
      runtime.broadcast_call(lambda: storage.write_bytes(url, buf.getvalue()), "pref.reference_written")
    return np.load(io.BytesIO(storage.read_bytes(url)), allow_pickle=False)

  def train_iter(self):
    return self.loader.train_iter()

  # ---------------------------------------------------------------- model and loss
  def optimizer(self):
    """AdamW of task.optim over trainer.steps, with LoRA at its rule (lr x lora.lr_scale, B's x lora.b_lr_ratio)."""
    o = self.pc.optim
    return self.optimizer_for(o.lr, lambda lr: o.build(self.cfg.trainer.steps, lr))

  def _buffers(self, params) -> dict:
    return {"ref": params} if self.pc.in_step_reference else {}

  @property
  def rebuilt_buffers(self) -> tuple[str, ...]:
    """The reference is the starting weights: rebuilt from them on resume, not checkpointed (`train.rebuilt`)."""
    return ("ref",) if self.pc.in_step_reference and self.lora is None else ()

  def abstract_batch(self, rows: int, seq_len: int) -> dict:
    """The training batch's shapes (global, unsharded) for `rows` pairs of two `seq_len`-token sides (a precomputed
    reference: [rows, 2] float32 log-probs), nothing allocated: what `jaxpod plan --compile` lowers this step with."""
    import jax
    import jax.numpy as jnp
    out = {k: jax.ShapeDtypeStruct((rows, 2, seq_len), jnp.int32) for k in ("tokens", "answer")}
    if "ref" in self.batch_ndims:
      out["ref"] = jax.ShapeDtypeStruct((rows, 2), jnp.float32)
    return out

  def loss_fn(self, graphdef) -> Callable:
    import jax
    import jax.numpy as jnp
    from jaxpod.models.llama.loss import token_logps
    from jaxpod.tasks.preference_loss import answer_logps, pair_loss
    lc, in_step = self.pc.loss, self.pc.in_step_reference

    def sequence_logps(gdef, weights, tokens_2PxL, answer_2PxL):
      total, count = answer_logps(token_logps(gdef, weights, tokens_2PxL[:, :-1], tokens_2PxL[:, 1:]),
                                  answer_2PxL[:, 1:])
      return total.reshape(-1, 2), count.reshape(-1, 2)  # [P, 2]: chosen, rejected

    def loss(params, buffers, batch, rng, carry):
      length = batch["tokens"].shape[-1]
      tokens, answer = batch["tokens"].reshape(-1, length), batch["answer"].reshape(-1, length)  # [2P, L]: one forward
      logp, count = sequence_logps(graphdef, self.weights(params, buffers), tokens, answer)
      refs = ()
      if lc.needs_reference:
        ref = (jax.lax.stop_gradient(sequence_logps(*self.reference(graphdef, buffers), tokens, answer)[0])
               if in_step else batch["ref"])
        refs = (ref[:, 0], ref[:, 1])
      per_pair, stats = pair_loss(lc, logp[:, 0], logp[:, 1], count[:, 0], count[:, 1], *refs)
      weight = batch["valid"].astype(jnp.float32) if "valid" in batch else jnp.ones_like(per_pair)
      pairs = jnp.sum(weight)
      total = jnp.sum(per_pair * weight)
      sums = {name: jnp.sum(value * weight) for name, value in stats.items()}
      sums.update(loss_sum=total, pairs=pairs, answer_tokens=jnp.sum(count * weight[:, None]))
      return total / jnp.maximum(pairs, 1.0), (carry, sums)

    return loss

  def normalize(self, raw: dict, global_batch: int) -> dict:
    pairs = max(raw["pairs"], 1.0)
    out = {"loss": raw["loss_sum"] / pairs, **{name: raw[name] / pairs for name in METRICS},
           "answer_tokens": raw["answer_tokens"]}
    out.update({k: raw[k] for k in ("lr", "grad_norm") if k in raw})
    return out

  # ---------------------------------------------------------------- eval, hooks, summary
  def evaluator(self, graphdef, mesh, ema_sh, buffer_sh, batch_sh):
    from jax.sharding import NamedSharding, PartitionSpec
    from jaxpod import runtime
    from jaxpod.tasks.preference_start import held_out_accuracy
    from jaxpod.train.state import batch_sharding
    from jaxpod.train.step import global_batch, host_metrics
    loss = self.loss_fn(graphdef)
    eval_sh = {**batch_sh, "valid": batch_sharding(mesh, 1)}
    fn = runtime.jit(lambda p, b, batch: loss(p, b, batch, None, ())[1][1], name="preference_eval_batch",
                     in_shardings=(ema_sh, buffer_sh, eval_sh), out_shardings=NamedSharding(mesh, PartitionSpec()))
    exact = (held_out_accuracy(graphdef, mesh, self.pc.sort, self.tokenizer, self.cfg.trainer.seed)
             if self.pc.data.path is None else None)

    def evaluate(params, buffers) -> dict:
      pending = [fn(params, buffers, global_batch(b, eval_sh))
                 for b in self.loader.eval_iter(self.pc.data.eval_batch_size)]
      raw: dict = {}
      for m in pending:
        for k, v in host_metrics(m).items():
          raw[k] = raw.get(k, 0.0) + v
      out = {**self.normalize(raw, 0), "count": int(raw["pairs"])}
      if exact is not None:
        acc = exact(self.weights(params, buffers), {})
        out |= {"accuracy": acc["accuracy"], "accuracy_count": acc["count"]}
      return out

    return evaluate

  def hooks(self, graphdef, mesh, tcfg) -> list:
    from jaxpod.sample.hook import sample_hooks
    if self.lora is None:
      return sample_hooks(self.pc, self.tokenizer, graphdef, mesh)
    return [*sample_hooks(self.pc, self.tokenizer, graphdef, mesh,
                          params_of=lambda state: self.weights(state.params, state.buffers)),
            *self.export_hooks(graphdef, None)]  # the adapters as PEFT's files in <run>/adapter

  def summary_fields(self, run_dir: str) -> dict:
    """What summary.json adds for this task: held-out exact match at the start and the end, the pair counts."""
    from jaxpod.train.tracker import read_metrics
    acc = [(r["step"], r["eval/accuracy"]) for r in read_metrics(run_dir) if "eval/accuracy" in r]
    start = next((a for s, a in acc if s == 0), None)
    end = acc[-1][1] if acc else None
    return {"accuracy.start": start, "accuracy.end": end, "accuracy": {"start": start, "end": end},
            "loss_kind": self.pc.loss.kind, "pairs": self.pair_counts,
            "lora": None if self.lora is None else dataclasses.asdict(self.lora)}

  def eval_summary(self, ev: dict) -> list[tuple[str, str]]:
    rows = [("eval loss", f"{ev.get('loss', float('nan')):.4f} on {ev.get('count', 0)} held-out pairs"),
            ("eval reward accuracy", f"{ev.get('rewards/accuracies', float('nan')):.1%}")]
    if "accuracy" in ev:
      rows.append(("held-out exact match", f"{ev['accuracy']:.1%} of {ev.get('accuracy_count', 0)} problems"))
    return rows
