"""jaxpod.sample: multi-host text generation from a (sharded) Llama.

    from jaxpod.sample import SampleConfig, run
    run(SampleConfig(model=ckpt, prompts="p.txt", out="out.jsonl", mode="replicated"))

or, with a model already in memory (e.g. during training), on every host:
    sampler = Sampler(model, mesh, EngineConfig(...), SamplingParams(), stop_ids, mode="global")
    completions = sampler.generate(prompt_ids, seeds)   # [(new ids, "stop" | "length"), ...]
    completions = sampler.generate(prompt_ids, seeds, n=4)  # 4 per prompt sharing its prefill, request-major

during training (imports the trainer's Hook, so it is not re-exported here):
    from jaxpod.sample.hook import SampleHook
    train(cfg, extra_hooks=[SampleHook(every=N, prompts=[...], tokenizer=tok, graphdef=graphdef)])
"""
from jaxpod.sample.config import MODES, EngineConfig, SampleConfig, SamplingParams
from jaxpod.sample.engine import generate, sample_tokens
from jaxpod.sample.run import read_prompts, run
from jaxpod.sample.sampler import Sampler, check_batch, check_memory, check_prompts, make_sample_mesh, memory_plan
