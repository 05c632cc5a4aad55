"""jaxpod.rl.rollout: the sampling side of RL: problems -> the engine -> scored groups (`roller`), a problem's
samples as one-turn requests or multi-turn episodes (`episodes`), groups -> the trainer's batch (`groups`)."""
