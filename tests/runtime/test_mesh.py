"""Meshes and logical sharding rules (single process, 8 fake CPU devices)."""
import logging

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from jaxpod.runtime import DEFAULT_RULES, MeshConfig, ShardingRules, constrain, make_mesh, state_shardings


def test_minus_one_fills_the_remaining_devices():
  mesh = make_mesh(data=-1, fsdp=2, model=2)
  assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "model": 2}


def test_data_axis_comes_first():
  assert make_mesh(fsdp=4).axis_names == ("data", "fsdp", "model")


@pytest.mark.parametrize("sizes, msg", [
    ({"data": 3}, "needs 3 devices but 8 are available"),
    ({"data": -1, "fsdp": 3}, "fixed axes multiply to 3, which does not divide 8"),
    ({"data": -1, "fsdp": -1}, "at most one axis may be -1"),
    ({"model": 0}, r"mesh.model=0 is invalid"),
])
def test_mesh_errors_name_the_sizes_and_the_fix(sizes, msg):
  with pytest.raises(ValueError, match=msg):
    make_mesh(**sizes)


def test_data_parallel_size_counts_fsdp():
  assert MeshConfig(data=-1, fsdp=2, model=2).data_parallel_size(16) == 8


def test_a_meshs_data_parallel_size_is_data_times_fsdp():
  """`data_parallel(mesh)`: what a batch splits over, the same count `MeshConfig.data_parallel_size` gives before the
  devices exist; a mesh without an fsdp axis counts it 1."""
  from jax.sharding import AbstractMesh
  from jaxpod.runtime.mesh import data_parallel
  assert data_parallel(AbstractMesh((2, 4, 1), ("data", "fsdp", "model"))) == MeshConfig(2, 4, 1).data_parallel_size(8)
  assert data_parallel(AbstractMesh((2, 4), ("data", "model"))) == 2


def test_rules_refuse_a_mesh_axis_used_twice():
  with pytest.raises(ValueError, match="maps mesh axis 'fsdp' twice .*'batch'.*'embed'"):
    DEFAULT_RULES.spec(("batch", "embed"))


def test_size_one_axes_are_dropped_from_specs():
  mesh = make_mesh(data=-1, fsdp=1, model=1)
  assert DEFAULT_RULES.spec(("batch", "seq", "act_embed"), mesh) == jax.sharding.PartitionSpec("data", None, None)


class _Tiny(nnx.Module):
  def __init__(self):
    self.w = nnx.Param(jnp.zeros((16, 32)), logical_axes=("embed", "mlp"))
    self.v = nnx.Param(jnp.zeros((11, 16)), logical_axes=("vocab", "embed"))
    self.buf = nnx.Variable(jnp.zeros((3,)))


class _Records(logging.Handler):
  def __init__(self):
    super().__init__()
    self.messages = []

  def emit(self, record):
    self.messages.append(record.getMessage())


def test_parameter_shardings_come_from_logical_axes():
  mesh = make_mesh(data=-1, fsdp=2, model=2)
  records = _Records()
  logging.getLogger("jaxpod.sharding").addHandler(records)
  try:
    sh = state_shardings(nnx.state(_Tiny()), mesh)
  finally:
    logging.getLogger("jaxpod.sharding").removeHandler(records)
  assert sh["w"].spec == jax.sharding.PartitionSpec("fsdp", "model")
  # vocab 11 does not divide over model=2: replicated with a warning naming the tensor and the axis
  assert sh["v"].spec == jax.sharding.PartitionSpec(None, "fsdp")
  assert sh["buf"].spec == jax.sharding.PartitionSpec()
  assert len(records.messages) == 1, records.messages
  assert records.messages[0].startswith("v (11, 16): dimension 0 ('vocab', size 11) is not divisible by mesh axis "
                                        "model (size 2): replicated")


def test_indivisible_dimensions_fail_unless_the_rules_allow_replication():
  mesh = make_mesh(data=-1, fsdp=2, model=2)
  strict = DEFAULT_RULES.replace_policy("error")
  with pytest.raises(ValueError, match=r"v \(11, 16\): dimension 0 \('vocab', size 11\) is not divisible by mesh "
                                       r"axis model \(size 2\); pad the dimension to a multiple of 2"):
    state_shardings(nnx.state(_Tiny()), mesh, strict)
  assert strict.replace(vocab=None).indivisible == "error"  # overrides keep the policy
  quiet = state_shardings(nnx.state(_Tiny()), mesh, DEFAULT_RULES.replace_policy("replicate"))
  assert quiet["v"].spec == jax.sharding.PartitionSpec(None, "fsdp")
  with pytest.raises(ValueError, match="indivisible='sometimes'"):
    DEFAULT_RULES.replace_policy("sometimes")
  with jax.set_mesh(mesh), pytest.raises(ValueError, match=r"logits \(8, 11\): dimension 1"):
    jax.jit(lambda x: constrain(x, ("batch", "vocab"), strict, name="logits"))(jnp.ones((8, 11)))


def test_constrain_is_a_no_op_without_a_mesh_and_shards_with_one():
  f = jax.jit(lambda x: constrain(x * 2, ("batch", "act_embed")))
  assert f(jnp.ones((8, 4))).sharding.is_fully_replicated
  with jax.set_mesh(make_mesh(data=-1, fsdp=2)):
    y = f(jnp.ones((8, 4)))
  assert y.sharding.spec == jax.sharding.PartitionSpec(("data", "fsdp"))


def test_rules_can_be_overridden_without_mutation():
  r = DEFAULT_RULES.replace(embed=None)
  assert r.spec(("embed", "mlp")) == jax.sharding.PartitionSpec(None, "model")
  assert DEFAULT_RULES.spec(("embed",)) == jax.sharding.PartitionSpec("fsdp")
  with pytest.raises(ValueError, match="more than once"):
    ShardingRules((("a", None), ("a", "data")))
