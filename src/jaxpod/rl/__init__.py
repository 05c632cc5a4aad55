"""jaxpod.rl: RL post-training (GRPO) that joins the trainer, the rollout engine and weight transfer.

    jaxpod rl                                                   # the built-in default, colocated
    jaxpod rl --topology disaggregated --rollout.workers 2      # trainer and workers as separate clusters

or in code, on every host of the job:

    from jaxpod.rl.config import RLConfig
    from jaxpod.rl.run import run
    summary = run(RLConfig())                                   # summary.json's contents on the trainer's leader

Modules by role. Top level, orchestration: config (RLConfig, its sections) and checks (everything before
JAX) -> run (resolves the config into typed slices: one PolicySpec per run; decides the topology and builds
the trainer's batch source) -> summary; the trainer side: grpo_task (GRPO, handed its batch source as an
argument), grpo (admission, advantages, loss), batch (groups -> the trainer's rows), adapters (LoRA's worker
side), colocated (the batch source that samples with the engine between train steps: `BatchSlot`). Sub-package
disaggregated/ (queue, queue_source, publish, worker, launch). What a trained policy needs whoever trains it
(its spec, LoRA rule, engine options, the rollout loop and episodes, the held-out evaluator, the warm-up, the
Llama task base) lives a floor below, in `jaxpod.policy`, shared with the preference task (`jaxpod.tasks`, a
sibling rl/ never imports); what is solved (problem sets, environments, rewards, verifiers, pass@k) below that,
in `jaxpod.problems`.

Extension points: a problem set is a config class registered with `@ProblemSet.register_subclass("name")`
(`jaxpod.problems.base`); a reward is a function registered with `@register_reward("name")` or named as
"module:function" in `rewards` (`jaxpod.problems.rewards`); an environment with `@register_environment`
(`jaxpod.problems.environments`).
"""
