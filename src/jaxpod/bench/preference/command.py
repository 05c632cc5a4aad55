"""`jaxpod bench preference [--json PATH]`: preference training throughput, jaxpod vs TRL, same model and pairs.

One run writes a random tiny Llama as a HF checkpoint (byte-level tokenizer files that encode as
jaxpod's `ByteTokenizer`, so both sides see the same ids) and a JSONL file of text pairs, then trains
each loss on each side in a process of its own (`side.py`): jaxpod's `preference` task on
the one trainer, and TRL 1.16's DPOTrainer (`dpo`) or CPOTrainer with `loss_type=simpo, cpo_alpha=0`
(`simpo`). Same batch, learning rate, beta, max_length; no eval, no checkpoints, constant schedule.
Sides alternate `repeats` times (load drifts on a shared machine hit both alike); medians are reported.

    training tokens/s   pairs/s x the mean real (non-pad) tokens of a pair: prompt + chosen and prompt +
                        rejected, counted once from the same tokenization for both sides (TRL pads each
                        batch to its longest row, jaxpod to max_length: the padding is not counted)
    peak RSS            the side's process peak resident memory (model, optimizer, reference, compiler)
    ratio               jaxpod tokens/s over TRL's for the same loss
"""
from __future__ import annotations

import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from jaxpod.bench.common import machine, print_table, write_json


@dataclasses.dataclass(frozen=True)
class PreferenceBench:
  """Options of `jaxpod bench preference`."""

  losses: tuple[str, ...] = ("dpo", "simpo")  # dpo: TRL DPOTrainer (sigmoid); simpo: TRL CPOTrainer (simpo)
  hidden_size: int = 256
  num_layers: int = 4
  num_heads: int = 4
  intermediate_size: int = 704
  pairs: int = 512  # pairs in the file
  digits: int = 24  # digits per sort problem: the prompt is ~31 tokens, each answer ~25
  batch: int = 16  # pairs per step (both sides)
  max_prompt_length: int = 40
  max_length: int = 72
  warmup: int = 3  # untimed steps (compilation, allocator warm-up)
  steps: int = 15  # timed steps per run
  repeats: int = 2  # alternating runs per side and loss; medians over all timed steps
  beta: float = 0.1  # DPO beta; SimPO uses simpo_beta
  simpo_beta: float = 2.0
  gamma_beta_ratio: float = 0.25
  lr: float = 1e-5
  json: str | None = None  # write the results here

  def __post_init__(self):
    if not set(self.losses) <= {"dpo", "simpo"}:
      raise ValueError(f"bench preference: losses={self.losses}; use dpo and/or simpo")
    if self.warmup < 1 or self.steps < 2 or self.repeats < 1:
      raise ValueError("bench preference: warmup >= 1, steps >= 2 and repeats >= 1")


def _write_inputs(o: PreferenceBench, folder: Path) -> tuple[str, str, float]:
  """(checkpoint folder, pair file, mean real tokens per pair)."""
  import jax
  import numpy as np
  from flax import nnx
  from jaxpod.data import sort_digits
  from jaxpod.data.preference_files import read_pair_file
  from jaxpod.models.llama import Llama, LlamaConfig, hf_io
  from jaxpod.models.llama.tokenizer import ByteTokenizer, save_byte_tokenizer
  cfg = LlamaConfig(vocab_size=259, hidden_size=o.hidden_size, intermediate_size=o.intermediate_size,
                    num_hidden_layers=o.num_layers, num_attention_heads=o.num_heads, num_key_value_heads=o.num_heads,
                    max_position_embeddings=max(128, o.max_length), tie_word_embeddings=False, bos_token_id=256,
                    eos_token_id=(257,), pad_token_id=258)
  ckpt = str(folder / "ckpt")
  with jax.default_device(jax.devices("cpu")[0]):
    hf_io.save(Llama(cfg, rngs=nnx.Rngs(params=0)), ckpt)
  save_byte_tokenizer(ckpt)
  rows = []
  for i in range(o.pairs):
    prompt, answer = sort_digits.sort_problem(0, 1, i, o.digits)
    rows.append({"prompt": prompt, "chosen": answer,
                 "rejected": sort_digits.teacher_habit(answer, np.random.default_rng(i), 1.0) + "0"})
  pairs = folder / "pairs.jsonl"
  pairs.write_text("".join(json.dumps(r) + "\n" for r in rows))
  arrays, _ = read_pair_file(str(pairs), ByteTokenizer(), o.max_prompt_length, o.max_length, 0.0)
  real = (arrays["tokens"] != ByteTokenizer().pad_id).sum() / len(arrays["tokens"])
  return ckpt, str(pairs), float(real)


def _side(side: str, options: dict) -> dict:
  proc = subprocess.run([sys.executable, "-m", "jaxpod.bench.preference.side", side, json.dumps(options)],
                        capture_output=True, text=True)
  lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
  if proc.returncode or not lines:
    raise RuntimeError(f"bench preference: the {side} side failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
  return json.loads(lines[-1][len("RESULT "):])


def run(json_path: str | None = None, **overrides) -> dict:
  """Run the benchmark; prints the table, writes JSON when asked, returns the results."""
  o = PreferenceBench(**overrides)
  with tempfile.TemporaryDirectory() as tmp:
    ckpt, pairs, tokens_per_pair = _write_inputs(o, Path(tmp))
    results: dict = {}
    for loss in o.losses:
      options = {"ckpt": ckpt, "pairs": pairs, "loss": loss, "beta": o.simpo_beta if loss == "simpo" else o.beta,
                 "gamma_beta_ratio": o.gamma_beta_ratio, "batch": o.batch, "max_prompt_length": o.max_prompt_length,
                 "max_length": o.max_length, "lr": o.lr, "warmup": o.warmup, "steps": o.steps, "runs": tmp + "/runs"}
      got: dict[str, dict] = {"jaxpod": {"step_s": [], "peak_rss_mib": []}, "trl": {"step_s": [], "peak_rss_mib": []}}
      for _ in range(o.repeats):
        for side in ("jaxpod", "trl"):
          r = _side(side, options)
          got[side]["step_s"] += r["step_s"]
          got[side]["peak_rss_mib"].append(r["peak_rss_mib"])
      for side, g in got.items():
        step = statistics.median(g["step_s"])
        results.setdefault(loss, {})[side] = {"median_step_s": step, "pairs_per_s": o.batch / step,
                                              "tokens_per_s": o.batch * tokens_per_pair / step,
                                              "peak_rss_mib": max(g["peak_rss_mib"]), "timed_steps": len(g["step_s"])}
      r = results[loss]
      r["ratio_tokens_per_s"] = r["jaxpod"]["tokens_per_s"] / r["trl"]["tokens_per_s"]
  rows = [[loss, side, f"{r[side]['tokens_per_s']:,.0f}", f"{r[side]['median_step_s'] * 1e3:.1f}",
           f"{r[side]['peak_rss_mib']:,.0f}", f"{r['ratio_tokens_per_s']:.2f}x" if side == "jaxpod" else "1.00x"]
          for loss, r in results.items() for side in ("jaxpod", "trl")]
  print_table(f"preference training, batch {o.batch} pairs, max_length {o.max_length}, "
              f"{tokens_per_pair:.0f} real tokens per pair",
              ["loss", "trainer", "training tokens/s", "median step ms", "peak RSS MiB", "vs TRL"], rows)
  payload = {"options": dataclasses.asdict(o), "tokens_per_pair": tokens_per_pair, "results": results,
             "machine": machine(),
             "baseline": "TRL 1.16 DPOTrainer / CPOTrainer(simpo), torch CPU, same process layout"}
  write_json(json_path, payload)
  return payload


def cli(opts: PreferenceBench) -> int:
  """Entry of `jaxpod bench preference`."""
  kwargs = {k: v for k, v in dataclasses.asdict(opts).items() if k != "json"}
  kwargs["losses"] = tuple(opts.losses)
  run(json_path=opts.json, **kwargs)
  return 0
