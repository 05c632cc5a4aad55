"""jaxpod.train: the multi-host trainer; one loop for every task (TRM on Sudoku, a causal LM on text).

    from jaxpod.train import TrainConfig, train
    summary = train(TrainConfig())                      # `jaxpod train` with the embedded default
    summary = train(cfg, extra_hooks=[MyHook()])        # hooks: see jaxpod.train.hooks

Modules: config (frozen configs, validation before JAX init), state (TrainState, shardings),
step (pure jitted train step), evaluate (full test set, EMA weights), hooks (Hook, StepInfo,
EvalHook, CheckpointHook), trainer (the loop), tracker (JSONL/TensorBoard/wandb, leader only),
progress (rich bar + summary), plot (`jaxpod plot`), data (dataset build + per-host iterators),
task (the `Task` interface and the TRM/Sudoku task; `lm:` in the config selects lm_task.LMTask).
"""
from jaxpod.train.config import DataConfig, TrackerConfig, TrainConfig, TrainerConfig, validate_for_hosts
from jaxpod.train.hooks import CheckpointHook, EvalHook, Hook, StepInfo
from jaxpod.train.trainer import RunSummary, train
