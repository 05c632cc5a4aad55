"""jaxpod.runtime: hosts, init, control plane, meshes + sharding rules, compile cache, launcher.

    from jaxpod import runtime
    host = runtime.init()                        # reads `jaxpod launch` / cluster variables
    runtime.barrier("after_load", timeout_s=60)  # named by call site, time-limited
    prompts = runtime.broadcast_call(read_prompts, "prompts")
"""
from jaxpod.runtime.compile_cache import CompileCacheConfig
from jaxpod.runtime.control import (ControlTimeout, PeerFailed, Unavailable, abort, allgather, barrier, broadcast,
                                    broadcast_call, check_peers, guard, leader_only)
from jaxpod.runtime.distributed import init, shutdown
from jaxpod.runtime.state import RuntimeConfig, cache_dir, host_info, is_initialized, is_leader
from jaxpod.runtime.hosts import HostInfo, detect_hosts, validate_divisible
from jaxpod.runtime.mesh import MESH_AXES, MeshConfig, describe_mesh, make_mesh, mesh_from_config
from jaxpod.runtime.program_check import ProgramMismatch, jit
from jaxpod.runtime.sharding import DEFAULT as DEFAULT_RULES, ShardingRules, constrain, logical_axes_of, state_shardings
