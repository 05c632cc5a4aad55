"""jaxpod.rl: RL post-training (GRPO) that joins the trainer, the rollout engine and weight transfer.

    jaxpod rl                                                   # the built-in default, colocated
    jaxpod rl --topology disaggregated --rollout.workers 2      # trainer and workers as separate clusters

or in code, on every host of the job:

    from jaxpod.rl.config import RLConfig
    from jaxpod.rl.run import run
    summary = run(RLConfig())                                   # summary.json's contents on the trainer's leader

Modules by role. Top level, orchestration: config (RLConfig, its sections) and checks (everything before
JAX) -> run (resolves the config into typed slices, decides the topology and builds the trainer's batch
source) -> summary; the trainer side: policy (PolicySpec, what both trainer tasks share) and train_tasks
(warm-up, GRPO, handed its batch source); grpo (admission, advantages, loss); colocated (the batch source
that samples with the engine between train steps). Sub-packages: rollout/ (roller, episodes, groups ->
batches) and disaggregated/ (queue, queue_source, publish, worker, launch). What is solved (problem sets,
environments, rewards, verifiers, pass@k) lives a floor below, in `jaxpod.problems`.

Extension points: a problem set is a config class registered with `@ProblemSet.register_subclass("name")`
(`jaxpod.problems.base`); a reward is a function registered with `@register_reward("name")` or named as
"module:function" in `rewards` (`jaxpod.problems.rewards`); an environment with `@register_environment`
(`jaxpod.problems.environments`).
"""
