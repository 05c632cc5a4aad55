"""jaxpod.rl: RL post-training (GRPO) that joins the trainer, the rollout engine and weight transfer.

    jaxpod rl                                                   # the built-in default, colocated
    jaxpod rl --topology disaggregated --rollout.workers 2      # trainer and workers as separate clusters

or in code, on every host of the job:

    from jaxpod.rl.config import RLConfig
    from jaxpod.rl.run import run
    summary = run(RLConfig())                                   # summary.json's contents on the trainer's leader

Modules by role: config (RLConfig, its sections) and checks (everything before JAX) -> run (resolves the
config into typed slices) -> policy (PolicySpec, what both trainer tasks share) and train_tasks (warm-up,
GRPO); grpo (admission, advantages, loss); colocated (the engine between train steps); disaggregated:
publish (weights out), worker (rollouts in), queue (storage and file format), queue_source (the trainer
consuming it), launch (role auto); roller (problems -> scored groups), rollouts (groups -> batches),
tasks and rewards (what is verified), summary.

Extension points: a verifiable task is a config class registered with
`@RLTaskConfig.register_subclass("name")` (`jaxpod.rl.tasks`); a reward is a function registered with
`@register_reward("name")` or named as "module:function" in `rewards` (`jaxpod.rl.rewards`).
"""
