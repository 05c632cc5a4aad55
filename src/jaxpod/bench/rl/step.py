"""The GRPO train step alone, on one workload's shapes: jaxpod's log-prob paths and torch's forward + backward.

Part of `jaxpod bench rl` (a table after the arms, and after `--against trl`'s table), or alone with
`jaxpod bench rl --step true`. One random policy of the workload's architecture is saved as a HF
checkpoint; both sides load it and run the GRPO loss (token log-probs of a [rows, row_len] batch, clipped
ratio against behaviour log-probs, DAPO token normalisation) on the same random rows:

  jaxpod fwd+bwd   `grpo.policy_logprobs` (the trainer's path: hidden states, then the vocab head and the
                   target's logit minus a logsumexp a chunk of positions at a time, rematerialised)
  plain fwd+bwd    the path before it: [B, T, V] float32 logits, then `grpo.token_logprobs`
  jaxpod step      fwd+bwd + grad-norm clip + AdamW, params and optimizer state donated (the train step)
  torch fwd+bwd    HF `LlamaForCausalLM` (torch CPU, SDPA attention), logits, gather - logsumexp, the same
                   loss, `backward()`; in its own process (torch and JAX never share one); skipped, with a
                   line saying so, when torch or transformers is not installed (`pip install jaxpod[test]`)

Rounds alternate the two sides (`repeats`): jaxpod's programs `calls` times each, round-robin call by call
(so a change in the machine's load hits each alike; chunked / plain is the median of the per-pair
ratios), then torch's `calls` calls in its own process; each figure is the median of its calls. `profile`: the jaxpod step traced once more, its device time by
category (attention, matmuls, other; `bench.common.device_shares`) and its most expensive XLA ops.
"""
from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
import tempfile

from jaxpod.bench.common import print_table, run_logged, time_calls

TOP_OPS = 12  # ops listed by the profile


@dataclasses.dataclass(frozen=True)
class StepShapes:
  """What the train step sees: a checkpoint (or a config to init one) and the batch's shape."""

  rows: int  # rows per step (prompts x n)
  row_len: int  # tokens per row (prompt + completion); the loss sees row_len - 1 positions
  completion: int  # completion tokens per row (the loss mask's last positions)


def _batch(shapes: StepShapes, vocab: int):
  import numpy as np
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, min(vocab, 256), (shapes.rows, shapes.row_len)).astype(np.int64)
  mask = np.zeros((shapes.rows, shapes.row_len), np.int64)
  mask[:, shapes.row_len - 1 - shapes.completion:shapes.row_len - 1] = 1
  behaviour = (-rng.random((shapes.rows, shapes.row_len)) * 4).astype(np.float32)
  adv = rng.standard_normal(shapes.rows).astype(np.float32)
  return tokens, mask, behaviour, adv


def _timed(fn, calls: int, warm: bool = True) -> float:
  """Median seconds of `calls` calls of fn() (after two untimed ones with `warm`)."""
  return statistics.median(time_calls(lambda _: fn(), calls, warmup=2 if warm else 0))


def jaxpod_programs(policy: str, shapes: StepShapes) -> tuple[dict, tuple]:
  """{name: a no-argument call running one program to completion} for the jaxpod rows, and (compiled step, args)."""
  import jax
  import jax.numpy as jnp
  import optax
  from flax import nnx
  from jaxpod.models.llama import hf_io
  from jaxpod.models.llama.model import forward
  from jaxpod.rl import grpo
  from jaxpod.runtime.mesh import make_mesh
  from jaxpod.sample.config import SamplingParams
  model = hf_io.load(policy, make_mesh())
  graphdef, params = nnx.split(model)
  tokens, mask, behaviour, adv = (jnp.asarray(x) for x in _batch(shapes, model.cfg.vocab_size))
  tokens, mask = tokens.astype(jnp.int32), mask > 0
  sampling = SamplingParams(temperature=1.0)

  def loss(p, plain: bool):
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    logp = (grpo.token_logprobs(forward(graphdef, p, inputs).logits, targets, sampling) if plain
            else grpo.policy_logprobs(graphdef, p, inputs, targets, sampling))
    return grpo.policy_loss(logp, behaviour[:, :-1], adv, mask[:, :-1], epsilon=0.2, epsilon_high=0.28, beta=0.0,
                            loss_norm="token", max_new_tokens=shapes.completion)

  grads = {plain: jax.jit(jax.value_and_grad(lambda p, plain=plain: loss(p, plain), has_aux=True))
           for plain in (False, True)}
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-6, b1=0.9, b2=0.99, weight_decay=0.0))

  def step(p, opt):
    (value, _), g = jax.value_and_grad(lambda q: loss(q, False), has_aux=True)(p)
    updates, opt = tx.update(g, opt, p)
    return optax.apply_updates(p, updates), opt, value

  compiled = jax.jit(step, donate_argnums=(0, 1)).lower(params, tx.init(params)).compile()
  state = {"p": jax.tree.map(jnp.copy, params), "opt": tx.init(params)}

  def run_step():
    state["p"], state["opt"], value = compiled(state["p"], state["opt"])
    value.block_until_ready()

  calls = {"jaxpod fwd+bwd": lambda: jax.block_until_ready(grads[False](params)),
           "plain fwd+bwd": lambda: jax.block_until_ready(grads[True](params)), "jaxpod step": run_step}
  return calls, (compiled, run_step)


def profile(compiled, run_step) -> tuple[dict, list[tuple]]:
  """(device share by category, [(op, share, shape, scope)] of the most expensive ops) of one traced step."""
  import collections
  import glob
  import re
  import jax
  from jaxpod.bench.common import device_shares, self_times
  hlo = compiled.as_text()
  shares = device_shares(lambda: [run_step() for _ in range(3)], [hlo])
  with tempfile.TemporaryDirectory(prefix="jaxpod-rl-step-") as folder:
    with jax.profiler.trace(folder):
      for _ in range(3):
        run_step()
    times = self_times(glob.glob(f"{folder}/**/*.xplane.pb", recursive=True)[0])
  ops = {}
  for m in re.finditer(r"^\s*(?:ROOT )?%?([\w.\-]+) = (\S+) ([\w\-]+)\((.*)$", hlo, re.M):
    meta = re.search(r'op_name="([^"]*)"', m.group(4))
    ops[m.group(1)] = (m.group(2).split("{")[0], (meta.group(1) if meta else m.group(3)).removeprefix("jit(step)/"))
  by_op: collections.Counter = collections.Counter()
  for (_, op), ns in times.items():
    by_op[op] += max(ns, 0)
  total = sum(by_op.values()) or 1
  top = [(op, ns / total, *ops.get(op, ("?", "?"))) for op, ns in by_op.most_common(TOP_OPS)]
  return shares, top


def torch_times(policy: str, shapes: StepShapes, calls: int) -> dict:
  """Torch's forward + backward of the same loss (runs in this process: call it through `main`)."""
  import torch
  from transformers import AutoModelForCausalLM
  model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32)
  tokens, mask, behaviour, adv = (torch.from_numpy(x) for x in _batch(shapes, model.config.vocab_size))
  m = mask[:, :-1].float()

  def fwd_bwd():
    logits = model(tokens[:, :-1]).logits.float()
    logp = logits.gather(-1, tokens[:, 1:, None])[..., 0] - torch.logsumexp(logits, -1)
    ratio = torch.exp(logp - behaviour[:, :-1])
    a = adv[:, None]
    per = -torch.minimum(ratio * a, torch.clamp(ratio, 0.8, 1.28) * a)
    loss = (per * m).sum() / m.sum().clamp(min=1)
    model.zero_grad(set_to_none=True)
    loss.backward()

  return {"torch fwd+bwd": _timed(fwd_bwd, calls), "torch_version": torch.__version__,
          "torch_threads": torch.get_num_threads()}


def _torch_round(policy: str, shapes: StepShapes, calls: int, folder: str, r: int) -> dict | None:
  """One torch round in its own process, or None when torch / transformers are missing."""
  import importlib.util
  if not all(importlib.util.find_spec(m) for m in ("torch", "transformers")):
    return None
  out = os.path.join(folder, f"torch-{r}.json")
  run_logged(["jaxpod.bench.rl.step", policy, json.dumps(dataclasses.asdict(shapes)), str(calls), out],
             os.path.join(folder, f"torch-{r}.log"), "bench rl: torch's forward + backward")
  return json.loads(open(out).read())


def save_policy(llama_cfg, folder: str) -> str:
  """A random policy of this architecture as a HF checkpoint under folder (both sides load it)."""
  from jaxpod.models.llama import hf_io
  from jaxpod.models.llama.model import init
  path = os.path.join(folder, "step-policy")
  hf_io.save(init(llama_cfg, 0), path)
  return path


def run(policy: str, shapes: StepShapes, *, repeats: int = 3, calls: int = 5, with_profile: bool = False,
        title: str = "") -> dict:
  """The table (and its figures) of the train step on `policy`'s architecture at `shapes`; rounds alternate sides."""
  folder = tempfile.mkdtemp(prefix="jaxpod-bench-rl-step-")
  programs, (compiled, run_step) = jaxpod_programs(policy, shapes)
  rounds: dict[str, list[float]] = {name: [] for name in programs}
  torch_rounds: list[dict] = []
  for call in programs.values():  # warm
    call(), call()
  for r in range(repeats):
    for _ in range(calls):  # round-robin call by call: a change of load hits every program alike
      for name, call in programs.items():
        rounds[name].append(_timed(call, 1, warm=False))
    got = _torch_round(policy, shapes, calls, folder, r)
    if got is not None:
      torch_rounds.append(got)
  med = {name: statistics.median(v) for name, v in rounds.items()}
  if torch_rounds:
    med["torch fwd+bwd"] = statistics.median(t["torch fwd+bwd"] for t in torch_rounds)
  out = {"shapes": dataclasses.asdict(shapes), "seconds": med, "rounds": rounds | {
      "torch fwd+bwd": [t["torch fwd+bwd"] for t in torch_rounds]}, "load_average": os.getloadavg()[0]}
  out["jaxpod_over_torch_fwd_bwd"] = med["jaxpod fwd+bwd"] / med["torch fwd+bwd"] if torch_rounds else None
  out["chunked_over_plain_fwd_bwd"] = statistics.median(a / b for a, b in zip(rounds["jaxpod fwd+bwd"],
                                                                              rounds["plain fwd+bwd"]))
  rows = [(name, f"{1e3 * s:.0f}", f"{s / med['jaxpod fwd+bwd']:.2f}") for name, s in med.items()]
  if not torch_rounds:
    rows.append(("torch fwd+bwd", "skipped", "torch / transformers not installed (pip install jaxpod[test])"))
  ratio = out["jaxpod_over_torch_fwd_bwd"]
  print_table(f"GRPO train step{title}: {shapes.rows} rows x {shapes.row_len} tokens, medians over {repeats} "
              f"rounds alternating jaxpod ({calls} calls of each program, round-robin) and torch ({calls} calls) "
              f"(ms); jaxpod / torch fwd+bwd = " + (f"{ratio:.2f}" if ratio is not None else "-")
              + f"; chunked / plain log-prob path (median of call pairs) = {out['chunked_over_plain_fwd_bwd']:.2f}"
              + f"; load {out['load_average']:.1f}",
              ["program", "ms", "/ jaxpod fwd+bwd"], rows)
  if with_profile:
    from jaxpod.bench.common import EIGEN_DOTS_CAVEAT, eigen_dots
    shares, top = profile(compiled, run_step)
    untraced = eigen_dots()
    caveat = f" ({EIGEN_DOTS_CAVEAT})" if untraced else ""
    out["profile"] = {"categories": shares, "top_ops": top, "untraced_dots": untraced}
    print_table(f"jaxpod step by category (device op time){caveat}", ["category", "share"],
                [(c, f"{s:.0%}") for c, s in shares.items()])
    print_table(f"jaxpod step: the {TOP_OPS} most expensive XLA ops (share of device op time){caveat}",
                ["op", "share", "shape", "scope"],
                [(op, f"{s:.1%}", shape, scope[-70:]) for op, s, shape, scope in top])
  return out


def main(argv=None) -> int:
  """`python -m jaxpod.bench.rl.step POLICY SHAPES_JSON CALLS OUT`: torch's side of one round."""
  policy, shapes, calls, out = argv or sys.argv[1:]
  got = torch_times(policy, StepShapes(**json.loads(shapes)), int(calls))
  with open(out, "w") as f:
    json.dump(got, f)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
