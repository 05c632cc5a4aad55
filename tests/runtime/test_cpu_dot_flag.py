"""jaxpod picks XLA:CPU's matmul library on import (src/jaxpod/__init__.py): Eigen's dots, not YNNPACK fusions,
unless the user's XLA_FLAGS or JAXPOD_XLA_CPU_DOTS says otherwise. Each case runs in a fresh interpreter, since
XLA reads its flags once per process."""
import json
import os
import platform
import subprocess
import sys

import pytest

import jaxpod

pytestmark = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                                reason="the flag is set on x86 only (jaxpod/__init__.py)")

PROBE = """
import json, os
import jaxpod, jax, jax.numpy as jnp
hlo = jax.jit(lambda a, b: a @ b).lower(jnp.ones((256, 64)), jnp.ones((64, 128))).compile().as_text()
print(json.dumps({"flags": os.environ.get("XLA_FLAGS", ""), "ynn": "__ynn_fusion" in hlo}))
"""


def _probe(**env) -> dict:
  full = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAXPOD_XLA_CPU_DOTS")} | env
  out = subprocess.run([sys.executable, "-c", PROBE], env=full, capture_output=True, text=True, check=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_jaxpod_compiles_matmuls_without_ynnpack():
  got = _probe()
  assert jaxpod.CPU_DOT_FLAG in got["flags"].split() and not got["ynn"]


def test_a_users_xla_flags_naming_the_option_are_left_alone():
  mine = "--xla_force_host_platform_device_count=2 --xla_cpu_experimental_ynn_fusion_type=dot"
  assert _probe(XLA_FLAGS=mine)["flags"] == mine


def test_jaxpod_xla_cpu_dots_ynn_keeps_xlas_default():
  got = _probe(JAXPOD_XLA_CPU_DOTS="ynn", XLA_FLAGS="--xla_force_host_platform_device_count=2")
  assert got == {"flags": "--xla_force_host_platform_device_count=2", "ynn": True}


def test_other_xla_flags_are_kept_next_to_it():
  got = _probe(XLA_FLAGS="--xla_force_host_platform_device_count=2")
  assert got["flags"].split() == ["--xla_force_host_platform_device_count=2", jaxpod.CPU_DOT_FLAG]


def test_a_profile_knows_when_its_dots_are_untraced():
  """Eigen's dots run asynchronously and a trace holds only their dispatch: the bench profiles must say so (a
  matmul share of ~2% was printed as fact). An empty YNN list means Eigen; a non-empty one, none, or an
  accelerator backend means the dots are timed; the last flag given wins, as in XLA."""
  from jaxpod.bench.common import eigen_dots
  assert eigen_dots(jaxpod.CPU_DOT_FLAG, "cpu")
  assert eigen_dots(f"--xla_dump_to=/tmp/x {jaxpod.CPU_DOT_FLAG}", "cpu")
  assert not eigen_dots("--xla_cpu_experimental_ynn_fusion_type=dot", "cpu")
  assert not eigen_dots(f"{jaxpod.CPU_DOT_FLAG} --xla_cpu_experimental_ynn_fusion_type=dot", "cpu")
  assert not eigen_dots("", "cpu")
  assert not eigen_dots(jaxpod.CPU_DOT_FLAG, "gpu")
