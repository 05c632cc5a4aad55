"""One side of `jaxpod bench preference`, run as its own process: `python -m jaxpod.bench.preference.side SIDE JSON`.

SIDE is `jaxpod` (the one trainer's preference task) or `trl` (TRL's DPOTrainer, or its CPOTrainer with
loss_type=simpo, cpo_alpha=0, for SimPO; torch CPU). Both read the same HF checkpoint and the same pair
file, train `warmup + steps` steps of `batch` pairs, and stamp the wall clock at the end of every step;
the child prints one line `RESULT {json}`: seconds of each timed step (after `warmup`) and the process's
peak resident memory. A process of its own per side keeps torch's and XLA's thread pools apart and makes
the peak memory that side's alone.
"""
from __future__ import annotations

import json
import resource
import sys
import time


def _peak_rss_mib() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def run_jaxpod(o: dict) -> list[float]:
  """Step end times (perf_counter) of the preference task on the one trainer."""
  from jaxpod.runtime.hooks import Listener
  from jaxpod.policy.llama_task import AdamWConfig
  from jaxpod.tasks.preference import PairData, PreferenceConfig
  from jaxpod.tasks.preference_loss import LossConfig
  from jaxpod.train import train
  from jaxpod.train.config import TrackerConfig, TrainConfig, TrainerConfig

  class Stamps(Listener):
    def __init__(self):
      self.times: list[float] = []

    def on_metrics(self, step, metrics):  # the loop drains step N's metrics: step N is done
      self.times.append(time.perf_counter())

  stamps = Stamps()
  data = PairData(path=o["pairs"], global_batch_size=o["batch"], eval_batch_size=o["batch"], eval_pairs=o["batch"],
                  max_prompt_length=o["max_prompt_length"], max_length=o["max_length"], cache_dir=o["runs"] + "/cache")
  loss = LossConfig(kind=o["loss"], beta=o["beta"], gamma_beta_ratio=o["gamma_beta_ratio"])
  task = PreferenceConfig(hf=o["ckpt"], data=data, loss=loss,
                          optim=AdamWConfig(lr=o["lr"], warmup_steps=0, weight_decay=0.0, grad_clip=0.0))
  trainer = TrainerConfig(steps=o["warmup"] + o["steps"], log_every=1000, ema=0.0, runs_dir=o["runs"],
                          run_name=f"{o['loss']}-{time.time_ns()}", progress=False, plot=False)
  train(TrainConfig(task=task, trainer=trainer, tracker=TrackerConfig(tensorboard=False)), extra_hooks=[stamps])
  return stamps.times


def run_trl(o: dict) -> list[float]:
  """Step end times of TRL's trainer on the same checkpoint and pairs."""
  import datasets
  import torch
  from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

  class Stamps(TrainerCallback):
    def __init__(self):
      self.times: list[float] = []

    def on_step_end(self, args, state, control, **kwargs):
      self.times.append(time.perf_counter())

  torch.manual_seed(0)
  stamps = Stamps()
  model = AutoModelForCausalLM.from_pretrained(o["ckpt"], dtype=torch.float32)
  tokenizer = AutoTokenizer.from_pretrained(o["ckpt"])
  data = datasets.load_dataset("json", data_files=o["pairs"], split="train")
  common = dict(output_dir=o["runs"] + "/trl", per_device_train_batch_size=o["batch"], learning_rate=o["lr"],
                max_steps=o["warmup"] + o["steps"], beta=o["beta"], max_length=o["max_length"], report_to=[],
                logging_steps=1000, save_strategy="no", use_cpu=True, lr_scheduler_type="constant",
                warmup_steps=0, max_grad_norm=0.0, dataloader_num_workers=0, seed=0)
  if o["loss"] == "simpo":
    from trl.experimental.cpo import CPOConfig, CPOTrainer
    args = CPOConfig(loss_type="simpo", cpo_alpha=0.0, simpo_gamma=o["gamma_beta_ratio"] * o["beta"], **common)
    trainer = CPOTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer, callbacks=[stamps])
  else:
    from trl import DPOConfig, DPOTrainer
    args = DPOConfig(loss_type=["sigmoid"], **common)
    trainer = DPOTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer, callbacks=[stamps])
  trainer.train()
  return stamps.times


def main() -> None:
  side, options = sys.argv[1], json.loads(sys.argv[2])
  times = (run_jaxpod if side == "jaxpod" else run_trl)(options)
  warm = options["warmup"]
  steps_s = [b - a for a, b in zip(times[warm - 1:], times[warm:])]  # the timed steps, one interval each
  print("RESULT " + json.dumps({"side": side, "step_s": steps_s, "peak_rss_mib": _peak_rss_mib()}), flush=True)


if __name__ == "__main__":
  main()
