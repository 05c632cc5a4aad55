"""`run(SampleConfig)`: prompt file -> completions JSONL, with every host taking part.

Order of work, the same on every host:
  1. the leader reads config.json, the prompt file and the tokenizer, tokenizes, and runs
     the memory check; the model config and a digest of the prompt ids (or the exception)
     reach every host through `runtime.broadcast_call`, so a tokenizer error or an oversized
     config raises everywhere instead of leaving the others waiting; then every host
     tokenizes the same file itself and checks the digest (data never rides the control plane);
  2. every host loads the checkpoint straight into its sharding (global: all devices;
     replicated: its own devices);
  3. every host runs the continuous engine over the requests it takes part in (see `sampler.py`);
  4. the leader detokenizes and writes the JSONL once (`logprobs`: one per sampled token, the stop
     token's included, so one more than `token_ids` when `finish_reason` is "stop"); a named
     barrier closes the job.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any


from jaxpod import runtime
from jaxpod.runtime import storage
from jaxpod.runtime.console import Bar
from jaxpod.models.llama import LlamaConfig, hf_io, load_tokenizer
from jaxpod.sample.config import SampleConfig
from jaxpod.sample.sampler import Sampler, check_batch, check_memory, make_sample_mesh


def read_prompts(path: str) -> tuple[list[str | list[dict]], list[int | None]]:
  """Prompts (and optional per-request seeds) from .jsonl ({"prompt": text or "messages": [{"role", "content"},
  ...], "seed"?}) or text lines; a message list is returned as is (`tokenized_prompts` renders it)."""
  from jaxpod.data.prompts import read_prompt_file
  rows = read_prompt_file(path, "sample.prompts", messages=True)
  return [r["prompt"] for r in rows], [r.get("seed") for r in rows]


def render_messages(cfg: SampleConfig, prompts: list) -> list[tuple[str, bool]]:
  """(text, rendered) per prompt: message lists rendered with the checkpoint's chat template and its generation
  prompt, as transformers' apply_chat_template does; text prompts as they are."""
  if all(isinstance(p, str) for p in prompts):
    return [(p, False) for p in prompts]
  from jaxpod.data.chat import load_chat_template, load_special_tokens, render_chat
  template = load_chat_template(cfg.hf)
  if template is None:
    raise ValueError(f"sample.prompts={cfg.prompts} gives message lists but sample.hf={cfg.hf} carries no "
                     "chat template (chat_template.jinja, or chat_template in tokenizer_config.json); add one or "
                     "give the prompts as text")
  specials = load_special_tokens(cfg.hf)
  return [(p, False) if isinstance(p, str) else
          (render_chat(template, p, add_generation_prompt=True, special_tokens=specials,
                       where=f"{cfg.prompts} prompt {i}"), True) for i, p in enumerate(prompts)]


def tokenized_prompts(cfg: SampleConfig, tok) -> tuple[list[str], list[list[int]], list[int]]:
  """(prompts as text, token ids, seeds) from the prompt file; raises on empty or too-long prompts.

  A rendered chat template is tokenized without added special tokens (it carries its own BOS, as
  apply_chat_template(tokenize=True) does)."""
  raw, seeds = read_prompts(cfg.prompts)
  if not raw:
    raise ValueError(f"{cfg.prompts} holds no prompts")
  rendered = render_messages(cfg, raw)
  prompts = [text for text, _ in rendered]
  ids = [tok.encode(text, add_special_tokens=not chat) for text, chat in rendered]
  empty = [i for i, x in enumerate(ids) if not x]
  if empty:
    raise ValueError(f"{cfg.prompts}: prompt(s) {empty[:5]} are empty (0 tokens); remove them or give them text")
  too_long = [i for i, x in enumerate(ids) if len(x) > cfg.max_prompt_len]
  if too_long:
    raise ValueError(f"prompt(s) {too_long[:5]} exceed sample.max_prompt_len={cfg.max_prompt_len} tokens "
                     f"(longest {max(len(ids[i]) for i in too_long)}); raise max_prompt_len or shorten them "
                     f"(prompts are never truncated)")
  return prompts, ids, [cfg.seed + i if s is None else int(s) for i, s in enumerate(seeds)]


def _digest(ids: list[list[int]], seeds: list[int]) -> str:
  return hashlib.sha256(json.dumps([ids, seeds]).encode()).hexdigest()


def _leader_plan(cfg: SampleConfig, mesh_for_check):
  """On the leader: model config, stop ids and the digest of the tokenized prompts; raises on any problem."""
  model_cfg = hf_io.load_config(cfg.hf, **({"dtype": cfg.dtype} if cfg.dtype else {}))
  check_memory(model_cfg, cfg.engine(), mesh_for_check)
  tok = load_tokenizer(cfg.hf)
  prompts, ids, seeds = tokenized_prompts(cfg, tok)
  plan = {"model_cfg": model_cfg.to_hf_config() | {"dtype": model_cfg.dtype}, "num_prompts": len(ids),
          "digest": _digest(ids, seeds), "stop_ids": sorted(set(tok.eos_ids) | set(cfg.stop_token_ids))}
  return plan, (tok, prompts, ids, seeds)


def _same_prompts_everywhere(cfg: SampleConfig, plan: dict, mine):
  """Every host tokenizes the prompt file itself (prompt ids never ride the control plane) and
  must get the leader's ids; any host that cannot is named on every host."""
  problem = None
  if mine is None:
    try:
      tok = load_tokenizer(cfg.hf)
      mine = (tok, *tokenized_prompts(cfg, tok))
      if _digest(mine[2], mine[3]) != plan["digest"]:
        problem = (f"sample.prompts={cfg.prompts} gives {len(mine[2])} prompts whose token ids differ from the "
                   f"leader's {plan['num_prompts']}; every host must read the same file: use a bucket URL or copy "
                   "the same file and checkpoint to every host")
    except Exception as e:  # noqa: BLE001 - reported on every host below
      problem = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
  problems = runtime.allgather(problem, "sample.prompts")
  bad = [(h, p) for h, p in enumerate(problems) if p]
  if bad:
    raise ValueError("; ".join(f"host {h}: {p}" for h, p in bad[:3]))
  return mine


def _progress(total: int) -> Bar:
  """Prompts done: a bar on the leader, nothing elsewhere."""
  return Bar("sampling", total, enabled=runtime.is_leader())


def run(cfg: SampleConfig) -> list[dict[str, Any]] | None:
  """Sample completions for `cfg.prompts`; returns the written records on the leader, None elsewhere."""
  cfg.check_files()
  runtime.init(cfg.runtime)
  mesh = make_sample_mesh(cfg.mode, cfg.mesh)
  check_batch(cfg.engine(), mesh)  # same mesh shape on every host: the same verdict everywhere
  leader_box: list = []

  def plan_fn():
    plan, mine = _leader_plan(cfg, mesh)
    leader_box.append(mine)
    return plan
  plan = runtime.broadcast_call(plan_fn, "sample.plan")
  tok, prompts, ids, seeds = _same_prompts_everywhere(cfg, plan, leader_box[0] if leader_box else None)
  model_cfg = LlamaConfig.from_hf_config(plan["model_cfg"], dtype=plan["model_cfg"]["dtype"])
  model = hf_io.load(cfg.hf, mesh, cfg=model_cfg)
  if cfg.adapter:  # LoRA: the adapters on the base, applied unmerged by the engine
    from jaxpod.models.llama import peft_io
    peft_io.load_adapter(model, cfg.adapter, mesh=mesh)
  runtime.barrier("sample.loaded")  # a host whose load failed is named here, before any device collective
  sampler = Sampler(model, mesh, cfg.engine(), cfg.sampling(), plan["stop_ids"], mode=cfg.mode)
  bar = _progress(len(ids) * cfg.n)
  try:
    results = sampler.generate(ids, seeds, on_chunk=lambda n: bar.update(advance=n), n=cfg.n)
  finally:
    bar.close()
  records = None
  if runtime.is_leader():
    version = cfg.weight_version or (f"{cfg.hf}+{cfg.adapter}" if cfg.adapter else cfg.hf)
    n = cfg.n
    records = [{"index": c.request, **({"sample": c.sample} if n > 1 else {}), "prompt": prompts[c.request],
                "completion": tok.decode(c.tokens), "token_ids": c.tokens, "finish_reason": c.finish_reason,
                "logprobs": [round(x, 6) for x in c.logprobs], "seed": seeds[c.request], "weight_version": version}
               for c in results]
    storage.write_text(cfg.out, "".join(json.dumps(r) + "\n" for r in records))  # atomic: no half file
  runtime.barrier("sample.done")
  return records
