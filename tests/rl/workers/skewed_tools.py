"""Worker of the 2-host episodes test: `python skewed_tools.py`.

Every host runs the same 8 episodes (2 problems x 4, 3 turns) with a tiny random Llama sharded over both hosts
(global mode), stepping its own environments, whose steps take 0.2 s on host 0 for odd episodes and on host 1 for
even ones: at any moment the hosts hold different observations. Then the same episodes turn by turn (a plain
callable: one `generate` per turn). Prints `EPISODES <digest of the round-by-round episodes> <same as turn by turn>
<observation broadcasts> <engine steps>` on every host.
"""
import hashlib
import time

from jaxpod import runtime

host = runtime.init(runtime.RuntimeConfig(control_timeout_s=90))

from jaxpod.models.llama import ByteTokenizer, abstract, init, tiny  # noqa: E402
from jaxpod.problems.base import Problem  # noqa: E402
from jaxpod.policy.rollout.episodes import TurnByTurn, run_episodes  # noqa: E402
from jaxpod.runtime import make_mesh, state_shardings  # noqa: E402
from jaxpod.sample import EngineConfig, Sampler, SamplingParams  # noqa: E402


class Skewed:
  """Answers every turn `= error` (the calculator's answer to a bad call), never done; slow on one host."""

  made = 0

  def __init__(self):
    self.episode, Skewed.made = Skewed.made, Skewed.made + 1

  def reset(self, problem):
    return problem.prompt

  def step(self, completion):
    if self.episode % 2 != host.process_index:
      time.sleep(0.2)
    return "= error\n", 0.0, False


from flax import nnx  # noqa: E402

cfg = tiny(bos_token_id=256, eos_token_id=(257,), pad_token_id=258)
mesh = make_mesh(data=-1)
model = init(cfg, seed=0, shardings=state_shardings(nnx.split(abstract(cfg))[1], mesh))
sampler = Sampler(model, mesh, EngineConfig(batch_size=4, max_prompt_len=40, max_new_tokens=4, steps_per_round=2,
                                            page_size=4), SamplingParams(1.0), [257], mode="global")
counts = {"broadcasts": 0, "steps": 0}
broadcast_call, step = runtime.broadcast_call, sampler.step


def counted_broadcast(fn, name, timeout_s=None):
  counts["broadcasts"] += 1
  return broadcast_call(fn, name, timeout_s)


def counted_step():
  counts["steps"] += 1
  return step()


runtime.broadcast_call, sampler.step = counted_broadcast, counted_step
problems = [Problem("2*3=", "6", 0, 0), Problem("hi", "", 0, 1)]


def episodes(engine):
  Skewed.made = 0
  got = run_episodes(engine, ByteTokenizer(), Skewed, problems, n=4, max_turns=3, seed=0, max_context=40,
                     keep_kv=True, tool_workers=8)
  return [(e.tokens, e.from_policy, e.versions, e.turns) for g in got for e in g]


rounds = episodes(sampler)
made = dict(counts)
turns = episodes(TurnByTurn(sampler.generate))
digest = hashlib.sha256(repr(rounds).encode()).hexdigest()[:16]
print(f"EPISODES {digest} {rounds == turns} {made['broadcasts']} {made['steps']}", flush=True)
