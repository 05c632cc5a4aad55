"""`SamplingOptions` (the knobs, declared once), `SampleConfig`: every size the sampler uses, fixed here (never derived per host)."""
from __future__ import annotations

import dataclasses
from typing import ClassVar

from jaxpod.runtime.state import RuntimeConfig
from jaxpod.runtime.mesh import MeshConfig

MODES = ("global", "replicated")
KV_LAYOUTS = ("slots", "paged")


def check_sampling(o, where: str) -> None:
  """One-line ValueError naming `<where>.<field>` if o's temperature / top_k / top_p are out of range."""
  if o.temperature < 0:
    raise ValueError(f"{where}.temperature={o.temperature} must be >= 0 (0 = greedy)")
  if o.top_k < 0:
    raise ValueError(f"{where}.top_k={o.top_k} must be >= 0 (0 = no top-k filter)")
  if not 0 < o.top_p <= 1:
    raise ValueError(f"{where}.top_p={o.top_p} must be in (0, 1] (1 = no nucleus filter)")


def check_engine(o, where: str) -> None:
  """One-line ValueError naming `<where>.<field>` if o's engine shapes (EngineConfig's fields) are invalid."""
  for name in ("batch_size", "max_prompt_len", "max_new_tokens", "page_size", "steps_per_round", "min_prefill_len",
               "decode_row_classes"):
    if getattr(o, name, 1) < 1:
      raise ValueError(f"{where}.{name}={getattr(o, name)} must be >= 1")
  if o.kv_layout not in KV_LAYOUTS:
    raise ValueError(f"{where}.kv_layout={o.kv_layout!r}; use one of {KV_LAYOUTS}")
  if not 0 < o.memory_fraction <= 1:
    raise ValueError(f"{where}.memory_fraction={o.memory_fraction} must be in (0, 1]")
  prefill_batch = getattr(o, "prefill_batch", None)
  if prefill_batch is not None and prefill_batch < 1:
    raise ValueError(f"{where}.prefill_batch={prefill_batch} must be >= 1 (or unset: batch_size)")
  cache_len = o.cache_len
  pages = -(-cache_len // o.page_size)
  if o.num_pages is not None and o.num_pages - 1 < pages:
    raise ValueError(f"{where}.num_pages={o.num_pages} is too small for one sequence: max_prompt_len + "
                     f"max_new_tokens = {cache_len} tokens need {pages} pages of page_size={o.page_size} plus the "
                     f"scratch page; set num_pages >= {pages + 1}")


@dataclasses.dataclass(frozen=True)
class SamplingParams:
  """How the next token is chosen; temperature 0 means greedy (argmax)."""

  temperature: float = 0.0  # 0: greedy; otherwise logits / temperature
  top_k: int = 0  # keep the k most likely tokens (0: all)
  top_p: float = 1.0  # keep the smallest set whose probability reaches top_p (1: all)

  def __post_init__(self):
    check_sampling(self, "sample")


@dataclasses.dataclass(frozen=True)
class EngineShape:
  """The engine's knobs a user sets, declared once: `EngineConfig` adds the engine's own sizes, `SamplingOptions`
  the sampling ones (and `jaxpod rl`'s rollout section is a `SamplingOptions`)."""

  batch_size: int = 8  # decode slots (lock-step engine: rows per chunk); global: whole mesh, replicated: per host
  kv_layout: str = "slots"  # slots: a [slots, capacity] row per slot, read in place (fast) | paged: a shared page pool
  max_prompt_len: int = 128  # longest prompt in tokens (static shape); longer prompts are an error
  max_new_tokens: int = 64  # tokens generated per completion at most
  stop_token_ids: tuple[int, ...] = ()  # extra stop ids besides the tokenizer's EOS
  memory_fraction: float = 0.9  # share of device memory the memory check allows
  device_memory_bytes: int | None = None  # per-device memory for the check; None: ask the leader's device
  page_size: int = 16  # paged: tokens per KV page
  num_pages: int | None = None  # paged: pages in the pool (page 0 is scratch); None: every slot at full length
  steps_per_round: int = 8  # decode steps per device call between two scheduling rounds

  @property
  def cache_len(self) -> int:
    """Tokens of one sequence at most, prompt and completion: a KV row (and an RL training row)."""
    return self.max_prompt_len + self.max_new_tokens


@dataclasses.dataclass(frozen=True)
class EngineConfig(EngineShape):
  """Static shapes of the compiled prefill + decode program; the same on every host."""

  prefill_batch: int | None = None  # prompts per prefill call; None: batch_size
  min_prefill_len: int = 16  # smallest prefill bucket (and slot KV capacity); buckets double up to the maximum
  decode_row_classes: int = 3  # slots: decode computes the live slots' class of all, 1/2, 1/4 ... (this many) slots

  def __post_init__(self):
    check_engine(self, "sample")

  @property
  def pages_per_seq(self) -> int:
    """Page-table width: pages of the longest sequence."""
    return -(-self.cache_len // self.page_size)

  @property
  def pool_pages(self) -> int:
    """Pages in the pool, scratch page included."""
    return self.num_pages if self.num_pages is not None else self.batch_size * self.pages_per_seq + 1

  def shard_pages(self, shards: int) -> int:
    """Pages in each of `shards` data shards' pools, its scratch page included: `pool_pages` split evenly (rounded
    up), so every shard holds the pages of its own rows at full length by default."""
    return -(-self.pool_pages // shards)

  @property
  def prefill_rows(self) -> int:
    return self.prefill_batch or self.batch_size

  def prefill_buckets(self) -> tuple[int, ...]:
    """Prefill lengths compiled: min_prefill_len doubled up to max_prompt_len (the last one)."""
    return _doubling(self.min_prefill_len, self.max_prompt_len)

  def kv_buckets(self) -> tuple[int, ...]:
    """Slot KV capacities compiled: min_prefill_len doubled, with a 1.5x step between two doublings from
    2 * min_prefill_len on (attention reads a slot's whole capacity: at most 1/3 of it is waste there), up to
    cache_len (the last one)."""
    return length_buckets(self.min_prefill_len, self.cache_len)


def length_buckets(smallest: int, largest: int) -> tuple[int, ...]:
  """`smallest` doubled, with a 1.5x step between two doublings from 2 * smallest on, up to `largest` (the last
  one): few compiled lengths, and past the first doubling at most 1/3 of a bucket is padding."""
  out = []
  for n in _doubling(smallest, largest)[:-1]:
    out.append(n)
    if n >= 2 * smallest and n * 3 // 2 < largest:
      out.append(n * 3 // 2)
  return tuple(out) + (largest,)


def _doubling(start: int, end: int) -> tuple[int, ...]:
  out, n = [], start
  while n < end:
    out.append(n)
    n *= 2
  return tuple(out) + (end,)


@dataclasses.dataclass(frozen=True)
class SamplingOptions(SamplingParams, EngineShape):
  """Every sampling knob a user sets (the engine's `EngineShape` and the draw's `SamplingParams`, each declared
  once): `jaxpod sample`, `SampleHook`, the LM task and the policy engine (`jaxpod rl`'s rollout section) use it.
  Errors name `<section>.<field>`, the option the user typed."""

  section: ClassVar[str] = "sample"  # the config section these fields sit in (error messages)

  n: int = 1  # completions per prompt (they share the prompt's prefill); sample j of a prompt is its own request
  seed: int = 0  # request i uses seed + i (jaxpod sample: unless its JSONL line sets "seed")

  def __post_init__(self):
    if self.n < 1:
      raise ValueError(f"{self.section}.n={self.n} must be >= 1 (completions per prompt)")
    check_engine(self, self.section)
    check_sampling(self, self.section)

  def engine(self) -> EngineConfig:
    """The engine's static shapes."""
    shape = {f.name: getattr(self, f.name) for f in dataclasses.fields(EngineShape)}
    return EngineConfig(**{**shape, "stop_token_ids": tuple(self.stop_token_ids)})

  def sampling(self) -> SamplingParams:
    """How the next token is chosen."""
    return SamplingParams(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)


@dataclasses.dataclass(frozen=True)
class SampleConfig(SamplingOptions):
  """`jaxpod sample`: a checkpoint, a prompt file, an output JSONL (and the `SamplingOptions` fields)."""

  old_names: ClassVar[dict[str, str]] = {"model": "hf"}  # accepted, warned once

  hf: str = ""  # HF checkpoint folder or fsspec URL (config.json + safetensors + tokenizer files)
  prompts: str = ""  # .txt (one prompt per line) or .jsonl ({"prompt": ..., optional "seed": ...})
  out: str = ""  # JSONL written once by the leader
  mode: str = "global"  # global: model sharded over all hosts | replicated: a full copy per host
  dtype: str | None = None  # compute dtype override: float32 | bfloat16 (None: the checkpoint's)
  weight_version: str = ""  # recorded with each output; "" means the checkpoint path
  adapter: str = ""  # PEFT LoRA adapter folder or URL (adapter_config.json + adapter_model.safetensors) on hf
  mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)  # over all devices (global) or a host's
  runtime: RuntimeConfig = dataclasses.field(default_factory=RuntimeConfig)  # how this process joins the job

  def __post_init__(self):
    if self.mode not in MODES:
      raise ValueError(f"sample.mode={self.mode!r}; use one of {MODES}")
    for name in ("hf", "prompts", "out"):
      if not getattr(self, name):
        raise ValueError(f"sample.{name} is required (--{name.replace('_', '-')} ...)")
    super().__post_init__()

  def check_files(self) -> None:
    """Invariant 7: the checkpoint config and the prompt file exist, and the config.json names a family jaxpod
    runs (before JAX initialises)."""
    import json
    import fsspec
    from jaxpod.models.llama.config import LlamaConfig
    for field, path in (("hf", f"{self.hf.rstrip('/')}/config.json"), ("prompts", self.prompts)):
      fs, p = fsspec.core.url_to_fs(path)
      if not fs.exists(p):
        raise FileNotFoundError(f"sample.{field}: {path} does not exist; point --{field} at "
                                f"{'a HF checkpoint folder' if field == 'hf' else 'a .txt or .jsonl file'}")
    with fsspec.open(f"{self.hf.rstrip('/')}/config.json", "r") as f:
      hf = json.load(f)
    try:
      LlamaConfig.from_hf_config(hf)
    except (ValueError, KeyError) as e:
      raise ValueError(f"sample.hf={self.hf}: {e}") from None
    if self.adapter:  # its shapes against the base's, in one line naming what does not fit
      from jaxpod.models.llama import peft_io
      peft_io.check_adapter(self.adapter, LlamaConfig.from_hf_config(hf))
