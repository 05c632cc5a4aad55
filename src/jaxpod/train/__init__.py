"""jaxpod.train: the multi-host trainer; one loop for every task (the tasks live in jaxpod.tasks).

    from jaxpod.train import TrainConfig, train
    summary = train(TrainConfig())                      # `jaxpod train` with the embedded default (trm_sudoku)
    summary = train(cfg, extra_hooks=[MyHook()])        # hooks: see jaxpod.runtime.hooks

Modules: config (frozen configs, the `TaskConfig` registry, validation before JAX init), task (the
`Task` interface), state (TrainState, shardings), step (pure jitted train step), hooks (EvalHook,
CheckpointHook, TrackerHook, ProgressHook), trainer (the loop), tracker (JSONL/TensorBoard/wandb,
leader only), progress (the bar + summary), plot (`jaxpod plot`), data (the shared data cache),
preemption (SIGTERM -> save and exit). Nothing here names a model family.
"""
from jaxpod.train.config import DataConfig, TaskConfig, TrackerConfig, TrainConfig, TrainerConfig, validate_for_hosts
from jaxpod.train.hooks import CheckpointHook, EvalHook, Hook, StepInfo
from jaxpod.train.trainer import RunSummary, train
