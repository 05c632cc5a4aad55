"""jaxpod.rl: RL post-training (GRPO) that joins the trainer, the rollout engine and weight transfer.

    jaxpod rl                                                   # the built-in default, colocated
    jaxpod rl --topology disaggregated --rollout.workers 2      # trainer and workers as separate clusters

or in code, on every host of the job:

    from jaxpod.rl.config import RLConfig
    from jaxpod.rl.run import run
    summary = run(RLConfig())                                   # summary.json's contents on the trainer's leader

Extension points: a verifiable task is a config class registered with
`@RLTaskConfig.register_subclass("name")` (`jaxpod.rl.tasks`); a reward is a function registered with
`@register_reward("name")` or named as "module:function" in `rewards` (`jaxpod.rl.rewards`).
"""
