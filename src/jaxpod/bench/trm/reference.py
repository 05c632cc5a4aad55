"""The reference PyTorch TRM's train step, timed in its own process for `jaxpod bench trm-step --reference DIR`.

Runs the reference's own model (`TinyRecursiveReasoningModel_ACTV1`), loss head (`ACTLossHead`)
and sparse sign-SGD optimizer from an unmodified checkout; AdamATan2 is `TorchAdamATan2` below,
written from the formula of the reference's `adam_atan2_reference` (its CUDA kernel does not run
on CPU). Deviations from `pretrain.py`: the ACTLossHead passes `valid_mask=` to the loss, which
only its stablemax loss accepts, so the softmax loss gets a wrapper that drops it (the mask it
would pass equals `labels != -100`, which `F.cross_entropy` already ignores) and makes the logits
contiguous (they are a slice past the puzzle-embedding positions; in bf16 the reference's
`.to(float32)` copies them, in fp32 it does not and its `.view` fails).

Protocol (one process, warmed once): the parent writes `run\n` to stdin; the worker times
`steps` train steps and prints one JSON line; `quit\n` ends it. With `--train-data` it instead
trains on the given batches and prints one JSON line per evaluation (`jaxpod bench trm-parity`).
Imports torch, never jax.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time


def missing_packages() -> list[str]:
  """Packages the reference imports that this interpreter lacks."""
  import importlib.util
  return [p for p in ("torch", "pydantic", "einops") if importlib.util.find_spec(p) is None]


def check_reference_dir(ref: str) -> None:
  """Raise a one-line error unless `ref` is a TinyRecursiveModels checkout."""
  if not os.path.isfile(os.path.join(ref, "models", "recursive_reasoning", "trm.py")):
    raise ValueError(f"--reference {ref!r}: no models/recursive_reasoning/trm.py there; pass a checkout of "
                     "SamsungSAILMontreal/TinyRecursiveModels")


def torch_adam_atan2(params, lr: float, betas=(0.9, 0.95), weight_decay: float = 0.0):
  """A torch optimizer applying the reference AdamATan2 formula (fp32, foreach), for CPU timing."""
  import torch

  class TorchAdamATan2(torch.optim.Optimizer):
    @torch.no_grad()
    def step(self, closure=None):
      for group in self.param_groups:
        ps = [p for p in group["params"] if p.grad is not None]
        if not ps:
          continue
        for p in ps:
          if not self.state[p]:
            self.state[p].update(step=0, m=torch.zeros_like(p), v=torch.zeros_like(p))
        st = [self.state[p] for p in ps]
        for s in st:
          s["step"] += 1
        t = st[0]["step"]
        b1, b2 = group["betas"]
        grads, ms, vs = [p.grad for p in ps], [s["m"] for s in st], [s["v"] for s in st]
        torch._foreach_mul_(ps, 1 - group["lr"] * group["weight_decay"])
        torch._foreach_lerp_(ms, grads, 1 - b1)
        torch._foreach_mul_(vs, b2)
        torch._foreach_addcmul_(vs, grads, grads, value=1 - b2)
        denom = torch._foreach_sqrt(vs)
        torch._foreach_div_(denom, math.sqrt(1 - b2 ** t))
        for p, m, d in zip(ps, ms, denom):
          p.add_(torch.atan2(m, d), alpha=-group["lr"] / (1 - b1 ** t))

  return TorchAdamATan2(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))


def _build(ref: str, model_config: dict, loss_type: str, optim: dict, seed: int):
  import torch
  sys.path.insert(0, os.path.abspath(ref))
  from models import losses
  from models.recursive_reasoning.trm import TinyRecursiveReasoningModel_ACTV1
  from models.sparse_embedding import CastedSparseEmbeddingSignSGD_Distributed
  if loss_type == "softmax_cross_entropy":
    plain = losses.softmax_cross_entropy
    losses.softmax_cross_entropy = lambda logits, labels, ignore_index=-100, valid_mask=None: plain(
        logits.contiguous(), labels, ignore_index=ignore_index)
  torch.manual_seed(seed)
  model = losses.ACTLossHead(TinyRecursiveReasoningModel_ACTV1(model_config), loss_type=loss_type)
  model.train()
  opts = [torch_adam_atan2(model.parameters(), optim["lr"], (optim["beta1"], optim["beta2"]), optim["weight_decay"])]
  if model_config["puzzle_emb_ndim"] > 0:
    opts.append(CastedSparseEmbeddingSignSGD_Distributed(
        model.model.puzzle_emb.buffers(), world_size=1, lr=optim["puzzle_emb_lr"],
        weight_decay=optim["puzzle_emb_weight_decay"]))
  return model, opts


def make_stepper(ref: str, model_config: dict, loss_type: str, optim: dict, batches: list, seed: int = 0):
  """A function running one reference train step (forward, backward of loss / batch, both optimizers)."""
  import torch
  model, opts = _build(ref, model_config, loss_type, optim, seed)
  batches = [{k: torch.as_tensor(v) for k, v in b.items()} for b in batches]
  state = {"carry": None, "i": 0}

  def step():
    batch = batches[state["i"] % len(batches)]
    state["i"] += 1
    if state["carry"] is None:
      state["carry"] = model.initial_carry(batch)
    state["carry"], loss, _, _, _ = model(carry=state["carry"], batch=batch, return_keys=[])
    ((1 / batch["inputs"].shape[0]) * loss).backward()
    for opt in opts:
      opt.step()
      opt.zero_grad()
    return float(loss.detach())
  return step, sum(p.numel() for p in model.parameters())


def _evaluate(model, batches: list) -> float:
  """Held-out exact accuracy as the reference evaluates: ACT steps from a fresh carry until all rows halt."""
  import torch
  model.eval()
  correct = count = 0.0
  with torch.inference_mode():
    for batch in batches:
      carry = model.initial_carry(batch)
      while True:
        carry, _, metrics, _, all_finish = model(carry=carry, batch=batch, return_keys=[])
        if all_finish:
          break
      correct += float(metrics["exact_accuracy"])
      count += float(metrics["count"])
  model.train()
  return correct / max(count, 1.0)


def train_curve(ref: str, spec: dict, data: dict) -> list[dict]:
  """Train the reference on jaxpod's exact batch sequence; held-out exact accuracy (EMA weights) per eval.

  The schedule is jaxpod's (linear warmup, then constant) on both optimizers; the EMA covers the
  parameters the reference's `EMAHelper` covers (those with requires_grad, not the sparse puzzle
  embedding, which is a buffer there)."""
  import torch
  o = spec["optim"]
  model, opts = _build(ref, spec["model_config"], spec["loss_type"], o, spec["seed"])
  bases = [o["lr"], o["puzzle_emb_lr"]][:len(opts)]
  named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
  ema = {n: p.detach().clone() for n, p in named}
  keys = ("inputs", "labels", "puzzle_identifiers")
  evals = [{k: torch.as_tensor(data[f"eval_{k}"][i]) for k in keys} for i in range(len(data["eval_inputs"]))]
  carry, curve, t0 = None, [], time.perf_counter()
  for step in range(1, spec["steps"] + 1):
    batch = {k: torch.as_tensor(data[f"train_{k}"][step - 1]) for k in keys}
    if carry is None:
      carry = model.initial_carry(batch)
    carry, loss, _, _, _ = model(carry=carry, batch=batch, return_keys=[])
    ((1 / batch["inputs"].shape[0]) * loss).backward()
    scale = step / o["warmup_steps"] if step < o["warmup_steps"] else 1.0
    for opt, base in zip(opts, bases):
      for group in opt.param_groups:
        group["lr"] = base * scale
      opt.step()
      opt.zero_grad()
    with torch.no_grad():
      for n, p in named:
        ema[n].mul_(spec["ema"]).add_(p.detach(), alpha=1 - spec["ema"])
    if step % spec["eval_every"] == 0 or step == spec["steps"]:
      live = {n: p.detach().clone() for n, p in named}
      with torch.no_grad():
        for n, p in named:
          p.copy_(ema[n])
      curve.append({"step": step, "exact_accuracy": _evaluate(model, evals), "wall_s": time.perf_counter() - t0})
      with torch.no_grad():
        for n, p in named:
          p.copy_(live[n])
      print(json.dumps(curve[-1]), flush=True)
  return curve

def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description="reference TRM step worker (stdin: run / quit)")
  ap.add_argument("--reference", required=True)
  ap.add_argument("--spec", required=True, help="JSON: model_config, loss_type, optim, batches, steps")
  ap.add_argument("--threads", type=int, default=0)
  ap.add_argument("--train-data", help="an .npz of train_*/eval_* batches: train and print the accuracy curve")
  args = ap.parse_args(argv)
  import numpy as np
  import torch
  if args.threads:
    torch.set_num_threads(args.threads)
  with open(args.spec) as f:
    spec = json.load(f)
  if args.train_data:
    with np.load(args.train_data) as data:
      train_curve(args.reference, spec, dict(data))
    return 0
  batches = [{k: np.asarray(v, np.int32) for k, v in b.items()} for b in spec["batches"]]
  step, n_params = make_stepper(args.reference, spec["model_config"], spec["loss_type"], spec["optim"], batches)
  t = time.perf_counter()
  for _ in range(2):
    step()
  print(json.dumps({"ready": True, "warmup_s": time.perf_counter() - t, "params": n_params,
                    "threads": torch.get_num_threads(), "torch": torch.__version__}), flush=True)
  for line in sys.stdin:
    if line.strip() != "run":
      break
    t = time.perf_counter()
    for _ in range(spec["steps"]):
      step()
    print(json.dumps({"step_s": (time.perf_counter() - t) / spec["steps"]}), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
