"""The policy: what it is (`PolicySpec`, with its model section) and the check every job of a run makes on its problems.

    policy = PolicySpec(PolicyModelConfig(), start_from="runs/rl-.../warmup/hf", lora=LoraSection(rank=4))
    policy.tokenizer, policy.llama, policy.stop_ids          # read once, shared by every part of the run

`PolicySpec` names the architecture, where the weights start and the LoRA adapters trained on them; from it
come the tokenizer, the Llama config and the stop ids, the same in the trainer, the rollout workers and the
checks. A run builds one and hands the same object to each part, so each is read once.
`check_same_problems` is the setup check every job of a run makes on the problems its hosts read.
"""
from __future__ import annotations

import dataclasses
import functools

from jaxpod.models.llama.config import LlamaConfig
from jaxpod.models.llama.tokenizer import Tokenizer
from jaxpod.policy.lora import LoraSection
from jaxpod.problems.base import ProblemSet


@dataclasses.dataclass(frozen=True)
class PolicyModelConfig(LlamaConfig):
  """The policy's architecture (byte-level vocabulary by default), or a HF checkpoint to start from."""

  hf: str = ""  # HF Llama checkpoint (folder or URL) to start from: skips the warm-up; its config.json wins
  vocab_size: int = 259  # ByteTokenizer: bytes 0..255, BOS 256, EOS 257, PAD 258
  hidden_size: int = 128
  intermediate_size: int = 384
  num_hidden_layers: int = 2
  num_attention_heads: int = 4
  num_key_value_heads: int = 4
  max_position_embeddings: int = 64
  tie_word_embeddings: bool = True
  bos_token_id: int | None = 256
  eos_token_id: tuple[int, ...] = (257,)
  pad_token_id: int | None = 258

  def llama(self) -> LlamaConfig:
    """The architecture alone (what the model and HF export take)."""
    fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(LlamaConfig)}
    return LlamaConfig(**fields)


@dataclasses.dataclass(frozen=True)
class PolicySpec:
  """The policy's architecture, starting weights and adapters; its tokenizer, config and stop ids are read once."""

  model: PolicyModelConfig  # the architecture; model.hf: the HF checkpoint whose config.json and tokenizer it is
  start_from: str | None = None  # HF checkpoint the weights start from (model.hf, a warm-up's export); None: random
  lora: LoraSection | None = None  # train LoRA adapters on the frozen start_from (rl/adapters.py); None: every weight

  @functools.cached_property
  def tokenizer(self) -> Tokenizer:
    """The HF checkpoint's tokenizer (model.hf), else byte-level."""
    from jaxpod.models.llama.tokenizer import ByteTokenizer, load_tokenizer
    return load_tokenizer(self.model.hf) if self.model.hf else ByteTokenizer()

  @functools.cached_property
  def llama(self) -> LlamaConfig:
    """The architecture: model.hf's config.json if any, else `model` (a warm-up's export holds that one)."""
    return start_config(self.model.hf, self.model.llama(), "model.hf")

  @functools.cached_property
  def stop_ids(self) -> tuple[int, ...]:
    """Sampling stops at the tokenizer's and the model's EOS ids."""
    return tuple(sorted(set(self.tokenizer.eos_ids) | set(self.llama.eos_token_id)))


def start_config(hf: str, model: LlamaConfig, field: str) -> LlamaConfig:
  """The architecture a Llama task trains: the HF checkpoint `hf`'s config.json (read through its family; no JAX),
  else `model`; a one-line FileNotFoundError naming `field` when `hf` holds none."""
  if not hf:
    return model
  from jaxpod.runtime import storage
  url = storage.join(hf, "config.json")
  if not storage.exists(url):
    raise FileNotFoundError(f"{field}={hf}: no config.json there; point it at a HF checkpoint")
  return LlamaConfig.from_json_file(url)


def check_same_problems(problem_set: ProblemSet, job: str) -> None:
  """Every host of this job holds the same problems, or a one-line ValueError naming the hosts that differ.

  Hosts refer to problems by (stream, index) and the engine runs the same prompts on every host (invariant 1):
  a prompt file that differs between hosts' disks, or was rewritten between their reads, would have them
  train on different data without any error. One allgather of a digest at setup; nothing when the problems
  are a pure function of the config."""
  from jaxpod.runtime import control, state
  digest = problem_set.fingerprint()
  if not digest or not state.in_multi_process_job():
    return
  seen = control.allgather(digest, f"rl.problems.fingerprint.{job}")
  differ = [h for h, d in enumerate(seen) if d != seen[0]]
  if differ:
    source = getattr(problem_set, "path", "the problem set's source")
    raise ValueError(f"rl.problems: {job} host(s) {differ} read other problems from {source} than host 0 (digests "
                     f"{seen[differ[0]][:12]} vs {seen[0][:12]}); every host must read the same file: put it in "
                     "the bucket (gs://...) or copy the same version to every host, and do not rewrite it while "
                     "a job starts")
