"""jaxpod.rl.disaggregated: trainer and rollout workers as separate jobs joined by storage: the rollout queue
(`queue`), the trainer's batch source over it (`queue_source`), weight publishing (`publish`), the worker
(`worker`) and `--role auto`'s launcher of both clusters (`launch`)."""
