"""jaxpod's TRM train step against the reference PyTorch step: two worker processes, alternating.

Each side is its own process (`jaxpod.bench.trm.step` and `jaxpod.bench.trm.reference`), built
and warmed once from the same config, optimizer settings and batches. Then, `runs` times, each is
told to time `steps` steps while the other waits on stdin; the side that goes first alternates
between rounds, so slow drift on a shared machine hits both. Figures are medians over rounds.
"""
from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile

from jaxpod.bench.trm.reference import check_reference_dir, missing_packages


class _Worker:
  """A benchmark worker process speaking one JSON line per `run` request."""

  def __init__(self, name: str, cmd: list[str]):
    self.name = name
    self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                 env=dict(os.environ, PYTHONUNBUFFERED="1"))
    self.ready = self._read()

  def _read(self) -> dict:
    line = self.proc.stdout.readline()
    if not line:
      code = self.proc.wait()
      raise RuntimeError(f"bench trm-step: the {self.name} worker exited (code {code}) before answering; "
                         "its error is printed above")
    return json.loads(line)

  def run(self) -> dict:
    self.proc.stdin.write("run\n")
    self.proc.stdin.flush()
    return self._read()

  def close(self) -> None:
    if self.proc.poll() is None:
      self.proc.stdin.write("quit\n")
      self.proc.stdin.close()
      self.proc.wait(timeout=60)


def compare(config_path, compute_dtype, cfg, ocfg, batches: list[dict], steps: int, runs: int, matmul_size: int,
            reference: str, threads: int = 0):
  """(jaxpod seconds/step per round, matmul FLOP/s per round, result fields incl. the reference side).

  `batches`: the NumPy batches both sides cycle through (`step.make_batches`), batch size their first axis.
  """
  batch = len(batches[0]["inputs"])
  check_reference_dir(reference)
  missing = missing_packages()
  if missing:
    raise RuntimeError(f"bench trm-step --reference: the reference needs {missing}, missing from {sys.executable}; "
                       "install them: pip install 'jaxpod[bench]'")
  batches = [{k: v.tolist() for k, v in b.items()} for b in batches]
  optim = {k: getattr(ocfg, k) for k in ("lr", "beta1", "beta2", "weight_decay", "puzzle_emb_lr",
                                         "puzzle_emb_weight_decay")}
  with tempfile.TemporaryDirectory() as tmp:
    jspec, rspec = os.path.join(tmp, "jaxpod.json"), os.path.join(tmp, "reference.json")
    with open(jspec, "w") as f:
      json.dump({"config": config_path, "compute_dtype": compute_dtype, "batches": batches, "steps": steps,
                 "matmul_size": matmul_size}, f)
    with open(rspec, "w") as f:
      json.dump({"model_config": cfg.to_reference(batch), "loss_type": cfg.loss_type, "optim": optim,
                 "batches": batches, "steps": steps}, f)
    workers = []
    try:
      workers.append(_Worker("jaxpod", [sys.executable, "-m", "jaxpod.bench.trm.step", jspec]))
      workers.append(_Worker("reference", [sys.executable, "-m", "jaxpod.bench.trm.reference", "--reference",
                                           reference, "--spec", rspec, "--threads", str(threads)]))
      ours, theirs = [], []
      for r in range(runs):
        order = workers if r % 2 == 0 else workers[::-1]
        for w in order:
          (ours if w.name == "jaxpod" else theirs).append(w.run())
    finally:
      for w in workers:
        w.close()
  jax_s, ref_s = [o["step_s"] for o in ours], [t["step_s"] for t in theirs]
  ratios = [b / a for a, b in zip(jax_s, ref_s)]
  extra = {
      "params": workers[0].ready["params"], "warmup_s": workers[0].ready["warmup_s"],
      "jaxpod_over_reference": statistics.median(ratios), "ratio_per_run": ratios,
      "reference": {"dir": os.path.abspath(reference), "step_s": statistics.median(ref_s),
                    "examples_per_s": batch / statistics.median(ref_s), "step_s_per_run": ref_s,
                    "params": workers[1].ready["params"], "threads": workers[1].ready["threads"],
                    "torch": workers[1].ready["torch"], "warmup_s": workers[1].ready["warmup_s"],
                    "optimizers": "AdamATan2 (pure torch, reference formula) + CastedSparseEmbeddingSignSGD_Distributed",
                    "model_config": cfg.to_reference(batch), "loss_type": cfg.loss_type,
                    "separate_process": True, "alternating": True},
      "optim": dataclasses.asdict(ocfg),
  }
  return jax_s, [o["matmul_flops_per_s"] for o in ours], extra
