"""jaxpod.plan: per-host and per-device bytes of a run on a pod, before anything runs (`jaxpod plan`).

    from jaxpod.plan import PlanOptions, plan_for
    p = plan_for(PlanOptions(model="llama-3-70b", pod="v5p-64"))
    p.phase("load").read_per_host, p.problems

Pure Python and numpy over the model's config.json (read by `models/llama/config.py`) and jaxpod's
sharding rules; no backend starts, no file but the config is read.
"""
from jaxpod.plan.model import Tensor, kv_bytes_per_token, resolve, tensors
from jaxpod.plan.phases import PHASES, Phase, Plan, make_plan
from jaxpod.plan.pods import PRESETS, PodShape
from jaxpod.plan.report import PlanOptions, plan_for, print_plan
from jaxpod.plan.workload import Workload

__all__ = ["PHASES", "PRESETS", "Phase", "Plan", "PlanOptions", "PodShape", "Tensor", "Workload", "kv_bytes_per_token",
           "make_plan", "plan_for", "print_plan", "resolve", "tensors"]
