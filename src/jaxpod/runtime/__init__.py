"""jaxpod.runtime: hosts, init, control plane, meshes + sharding rules, compile cache, launcher."""
from jaxpod.runtime.hosts import HostInfo, detect_hosts, validate_divisible
from jaxpod.runtime.mesh import MESH_AXES, MeshConfig, describe_mesh, make_mesh, mesh_from_config
from jaxpod.runtime.sharding import DEFAULT as DEFAULT_RULES, ShardingRules, constrain, logical_axes_of, state_shardings
