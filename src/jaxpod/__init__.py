"""jaxpod: multi-host JAX, correct by construction."""
import os
import platform

__version__ = "0.1.0"

# XLA:CPU's matmuls on its Eigen runtime instead of YNNPACK fusions (x86): the GRPO train step's forward +
# backward ran ~5% faster on the long RL workload's shapes (jaxpod / torch 1.26-1.31 -> 1.10-1.21), sampling and TRM's
# step unchanged (docs/benchmarks.md, "XLA:CPU's matmul library"). Set on import, before any JAX backend starts,
# so every jaxpod process and launched host compiles the same programs; a user's XLA_FLAGS naming the option wins,
# and JAXPOD_XLA_CPU_DOTS=ynn keeps XLA's default. Accelerator backends ignore it.
CPU_DOT_FLAG = "--xla_cpu_experimental_ynn_fusion_type="


def _cpu_dot_flag() -> None:
  flags = os.environ.get("XLA_FLAGS", "")
  if (platform.machine().lower() in ("x86_64", "amd64") and os.environ.get("JAXPOD_XLA_CPU_DOTS", "eigen") == "eigen"
      and "ynn_fusion_type" not in flags):
    os.environ["XLA_FLAGS"] = f"{flags} {CPU_DOT_FLAG}".strip()


_cpu_dot_flag()
