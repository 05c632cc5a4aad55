"""jaxpod.policy: what a trained Llama policy needs, whoever trains it (`jaxpod rl`, the preference default).

The floor under both `jaxpod.rl` and `jaxpod.tasks` (which never import each other), above the workloads:

    spec        PolicySpec: the architecture (`PolicyModelConfig`, `model.hf`), the starting weights, the adapters;
                its tokenizer and config read once per run; `check_same_problems` (every host reads the same)
    lora        LoraSection: LoRA's section and its learning-rate rule, one for rl, preference and causal LM
    engine      EngineOptions (jaxpod.sample's options with the policy's defaults) and `make_sampler`
    rollout/    problems -> the engine -> scored groups (`roller`), one-turn samples or episodes (`episodes`),
                one problem's scored samples (`groups`)
    evaluate    Accuracy: the held-out evaluator (greedy accuracy, pass@k)
    llama_task  LlamaTask: the trainer-task base of every Llama task (build, load, LoRA, export hooks);
                AdamWConfig and `byte_llama` for `jaxpod train`'s Llama tasks
    task        PolicyTask: what a policy's trainer tasks on a problem set share
    warmup      the supervised warm-up task and its run (`warmup_run`)
"""
