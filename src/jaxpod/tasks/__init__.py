"""jaxpod.tasks: the workloads the one trainer runs, one module per task (beside rl, above policy, train and sample).

    trm_sudoku   TRM on generated (or given) Sudoku puzzles: ACT carry, exact-accuracy eval (the default)
    causal_lm    a Llama on a text file: next-token loss, perplexity eval, samples while training
    preference   SimPO, DPO, IPO on preference pairs; its built-in default evaluated by the policy's held-out evaluator

A task module holds its config class, registered for `task: {type: NAME}` by one line,
`@TaskConfig.register_subclass("NAME")` (draccus's PluginRegistry imports every module of this
package when a name is looked up), and the `jaxpod.train.task.Task` its `build` returns. The
trainer never imports a task; a task imports the trainer's generic parts, sample's hook, the Llama task base
(`jaxpod.policy.llama_task`) and, for the preference default, the policy's warm-up and evaluator (`jaxpod.policy`);
never `jaxpod.rl`.
"""
