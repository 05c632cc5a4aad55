"""Worker for the multi-host sampling tests: `python sample_worker.py SCENARIO MODEL PROMPTS OUT_DIR [BAD_MODEL]`.

modes: runs `jaxpod.sample.run` in global then replicated mode; the leader writes OUT_DIR/<mode>.jsonl.
fail:  a broken tokenizer on the leader, then an oversized config; prints `FAIL <case> <type> <message>`
       on every host, which must all get there (no hang) and agree.
"""
import dataclasses
import json
import sys

from jaxpod import runtime

scenario, model, prompts, out_dir = sys.argv[1:5]
runtime.init(runtime.RuntimeConfig(control_timeout_s=90))

from jaxpod.runtime import MeshConfig  # noqa: E402
from jaxpod.sample import SampleConfig, run  # noqa: E402

BASE = SampleConfig(model=model, prompts=prompts, out=f"{out_dir}/x.jsonl", batch_size=4, max_prompt_len=32,
                    max_new_tokens=8, temperature=0.8, top_k=20, top_p=0.9, seed=11)


def fail(case, cfg):
  try:
    run(cfg)
    print(f"FAIL {case} none", flush=True)
  except Exception as e:  # noqa: BLE001 - reported for the test
    print(f"FAIL {case} {json.dumps({'type': type(e).__name__, 'message': str(e)})}", flush=True)


if scenario == "modes":
  run(dataclasses.replace(BASE, mode="global", out=f"{out_dir}/global.jsonl", mesh=MeshConfig(data=2, model=2)))
  run(dataclasses.replace(BASE, mode="replicated", out=f"{out_dir}/replicated.jsonl"))
  print("DONE", flush=True)
elif scenario == "fail":
  fail("tokenizer", dataclasses.replace(BASE, model=sys.argv[5]))
  fail("memory", dataclasses.replace(BASE, batch_size=4096, max_new_tokens=1_000_000))  # TBs of KV cache
  runtime.barrier("sample_worker.end", 60)
  print("DONE", flush=True)
runtime.shutdown()
