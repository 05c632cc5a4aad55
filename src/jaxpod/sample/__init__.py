"""jaxpod.sample: multi-host text generation from a (sharded) Llama.

Modules: config (SamplingOptions, EngineConfig, SamplingParams), tokens (Completion, token sampling:
what both engines share), lockstep (the lock-step reference engine), the continuous engine: scheduler
+ runner + steps, one module per KV layout (slots, paged), layout (the engine's inference layout for
weights, collectives read from compiled HLO), memory (KV and weight bytes per device, the device-memory
check), sampler (Sampler), run (`jaxpod sample`), hook.

    from jaxpod.sample import SampleConfig, run
    run(SampleConfig(model=ckpt, prompts="p.txt", out="out.jsonl", mode="replicated"))

or, with a model already in memory (e.g. during training), on every host:
    sampler = Sampler(model, mesh, EngineConfig(...), SamplingParams(), stop_ids, mode="global")
    completions = sampler.generate(prompt_ids, seeds)   # [Completion(sampled, finish_reason, logprobs, versions, ...)]
    completions = sampler.generate(prompt_ids, seeds, n=4)  # 4 per prompt sharing its prefill, request-major

incrementally, with new weights between scheduling rounds (RL rollout workers):
    handles = sampler.submit(prompt_ids, seeds, n=4)
    while not sampler.idle:
      done = sampler.step()                     # completions finished in this round
      sampler.update_params(new_params, version=7)  # same shapes/shardings: no recompilation

multi-turn (an episode's turns): keep each finished sample's KV; a request extending its tokens prefills only
what was appended (the last sampled token + the observation) and decodes on:
    out = sampler.generate(prompts, seeds, n=4, keep=True)
    out = sampler.generate([p + c.sampled + obs for ...], turn_seeds, keep=True)   # continues each one

during training (a `jaxpod.runtime.hooks.Hook`):
    from jaxpod.sample.hook import SampleHook
    train(cfg, extra_hooks=[SampleHook(every=N, prompts=[...], tokenizer=tok, graphdef=graphdef,
                                       options=SamplingOptions(max_new_tokens=32))])
"""
from jaxpod.sample.config import MODES, EngineConfig, SampleConfig, SamplingOptions, SamplingParams
from jaxpod.sample.lockstep import generate
from jaxpod.sample.run import read_prompts, run
from jaxpod.sample.sampler import Sampler, check_batch, check_memory, check_prompts, make_sample_mesh, memory_plan
from jaxpod.sample.tokens import Completion, sample_tokens, token_logprobs
