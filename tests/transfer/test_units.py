"""In-process checks of the pieces under the transports: config validation, flatten, the hook."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpod.transfer import PublishWeightsHook, TransferConfig, flatten


@pytest.mark.parametrize("kwargs, field", [
    ({"mode": "nccl"}, "transfer.mode"),
    ({"mode": "checkpoint"}, "transfer.folder"),
    ({"mode": "ray", "coordinator": "kv"}, "transfer.coordinator"),
    ({"keep_n": 0}, "transfer.keep_n"),
    ({"wire_dtype": "int8"}, "transfer.wire_dtype"),
    ({"chunk_bytes": 8, "stream_bytes": 4}, "transfer.stream_bytes"),
    ({"mode": "jax_transfer", "bind_address": "0.0.0.0"}, "transfer.bind_address"),  # no authentication
    ({"secret_env": "not a variable"}, "transfer.secret_env"),
    ({"min_mb_per_s": 0}, "transfer.min_mb_per_s"),
])
def test_config_errors_name_the_field(kwargs, field):
  """Invariant 7: config errors are reported before anything starts, naming the field."""
  with pytest.raises(ValueError, match=field.replace(".", r"\.")):
    TransferConfig(**kwargs)


def test_deadlines_grow_with_the_bytes_moved():
  """A fixed deadline that fits a small model is outrun by a large one's upload: each adds bytes / rate."""
  cfg = TransferConfig(publish_timeout_s=60.0, min_mb_per_s=20.0)
  assert cfg.deadline_s(cfg.publish_timeout_s, 0) == 60.0
  assert cfg.deadline_s(cfg.publish_timeout_s, 16_000_000_000) == 60.0 + 800.0  # an 8B model in bf16


def test_config_defaults_bind_loopback_and_pick_coordinator():
  assert TransferConfig().bind_address == "127.0.0.1"
  assert TransferConfig().coordinator == "ray"
  assert TransferConfig(mode="checkpoint", folder="/tmp/x").coordinator == "filesystem"


def _mesh(shape, names):
  devices = np.array(jax.devices()[:int(np.prod(shape))]).reshape(shape)
  return jax.sharding.Mesh(devices, names, axis_types=(jax.sharding.AxisType.Auto,) * len(shape))


def test_pieces_reassemble_onto_another_mesh_with_wire_cast():
  P = jax.sharding.PartitionSpec
  src = jax.sharding.NamedSharding(_mesh((4,), ("x",)), P("x", None))
  dst = jax.sharding.NamedSharding(_mesh((2, 2), ("a", "b")), P(None, "b"))
  x = jax.device_put(jnp.arange(32.0).reshape(8, 4), src)
  tree = {"w": x, "n": jnp.arange(3)}
  table, pieces = flatten.to_pieces(tree, wire_dtype="bfloat16")  # one process: one piece per array
  assert len(pieces) == 2 and table["w"]["wire"] == "bfloat16" and table["n"]["wire"] == "int32"
  like = {"w": jax.ShapeDtypeStruct((8, 4), jnp.float32, sharding=dst), "n": jax.ShapeDtypeStruct((3,), jnp.int32)}
  asm = flatten.Assembler(table, like)
  for p in reversed(pieces):  # arrival order does not matter
    asm.put_bytes(p.meta(), p.data.tobytes())
  out = asm.finish()
  assert out["w"].sharding == dst and out["w"].dtype == jnp.float32
  np.testing.assert_array_equal(np.asarray(out["w"]), np.arange(32.0).reshape(8, 4))  # exact in bf16
  np.testing.assert_array_equal(np.asarray(out["n"]), np.arange(3))


def test_assembler_refuses_a_different_model_and_missing_bytes():
  table, pieces = flatten.to_pieces({"w": np.zeros((2, 3), np.float32)})
  with pytest.raises(ValueError, match="missing on the wire"):
    flatten.Assembler(table, {"v": jax.ShapeDtypeStruct((2, 3), jnp.float32)})
  with pytest.raises(ValueError, match="shape"):
    flatten.Assembler(table, {"w": jax.ShapeDtypeStruct((3, 2), jnp.float32)})
  asm = flatten.Assembler(table, {"w": jax.ShapeDtypeStruct((2, 3), jnp.float32)})
  with pytest.raises(RuntimeError, match="0 of 6 elements"):
    asm.finish()


def test_assembler_takes_only_the_slices_this_host_needs():
  """A client host that holds rows 2..6 of a (8, 4) array (as on a 2-host client mesh) wants only
  the overlapping blocks of each trainer piece, and is complete once those arrive."""
  w = np.arange(32, dtype=np.float32).reshape(8, 4)
  meta = [{"name": "w", "index": [[0, 4], [0, 4]], "nbytes": 64}, {"name": "w", "index": [[4, 8], [0, 4]], "nbytes": 64},
          {"name": "w", "index": [[0, 8], [0, 1]], "nbytes": 32}]
  table = {"w": {"shape": [8, 4], "dtype": "float32", "wire": "float32"}}
  asm = flatten.Assembler(table, {"w": jax.ShapeDtypeStruct((8, 4), jnp.float32)})
  assert asm.blocks(meta[0]) == [((0, 4), (0, 4))]  # one host needs everything: whole pieces
  asm.regions["w"] = [((2, 6), (0, 4))]  # what needed_regions gives a host of a multi-host mesh
  asm.filled = {("w", ((2, 6), (0, 4))): 0}
  assert asm.blocks(meta[0]) == [((2, 4), (0, 4))] and asm.blocks(meta[1]) == [((0, 2), (0, 4))]
  assert asm.blocks(meta[2]) == [((2, 6), (0, 1))] and asm.wanted_bytes(meta[0]) == 32
  for m in meta[:2]:
    piece = w[tuple(slice(a, b) for a, b in m["index"])]
    (block,) = asm.blocks(m)
    asm.put_block_bytes(m, block, np.ascontiguousarray(piece[tuple(slice(a, b) for a, b in block)]).tobytes())
  np.testing.assert_array_equal(asm.buffers["w"][2:6], w[2:6])
  assert asm.filled[("w", ((2, 6), (0, 4)))] == 16
  meta_far = {"name": "w", "index": [[6, 8], [0, 4]], "nbytes": 32}
  assert asm.blocks(meta_far) == []  # nothing of it is needed: never fetched


@pytest.mark.parametrize("block", [[[0, 8], [0, 16]], [[2, 5], [0, 16]], [[0, 8], [4, 12]], [[3, 4], [5, 9]]])
def test_flight_tickets_cover_a_block_exactly(block):
  """Tickets for a block (contiguous: byte ranges; strided: row groups) rebuild the block's bytes."""
  from jaxpod.transfer import flight
  piece = np.arange(128, dtype=np.float32).reshape(8, 16)
  meta = {"name": "w", "index": [[0, 8], [0, 16]], "nbytes": piece.nbytes}
  want = np.ascontiguousarray(piece[tuple(slice(a, b) for a, b in block)])
  dst = np.zeros(want.nbytes, np.uint8)
  tickets = list(flight.tickets(1, 0, meta, block, 4, stream_bytes=40))
  for ticket, off, n in tickets:  # what the server sends for each ticket
    sent = np.ascontiguousarray(piece[tuple(slice(a, b) for a, b in ticket["block"])]).reshape(-1).view(np.uint8)
    dst[off:off + n] = sent[ticket["start"]:ticket["end"]]
  assert dst.tobytes() == want.tobytes() and (len(tickets) > 1 or want.nbytes <= 40)


def test_publish_hook_every_n():
  published = []

  class FakeServer:
    def publish(self, step, params):
      published.append(step)

  hook = PublishWeightsHook(FakeServer(), every=3)
  for step in range(1, 8):
    hook(step, {})
  hook(8, {}, force=True)
  assert published == [3, 6, 8] and hook.last_published == 8

  class Info:  # the trainer's StepInfo, duck-typed (jaxpod.train.hooks)
    def __init__(self, step):
      self.step, self.state, self.final = step, type("S", (), {"params": {}})(), False
  assert hook.due(9) and not hook.due(10) and hook.due(10, final=True)
  hook(Info(9))
  assert published == [3, 6, 8, 9]
  with pytest.raises(ValueError, match="every"):
    PublishWeightsHook(FakeServer(), every=0)


def test_checkpoint_mode_over_a_non_local_filesystem():
  """checkpoint mode through fsspec's memory:// (the path gs:// takes: bytes, not local files)."""
  from jaxpod.transfer import create_client, create_server
  cfg = TransferConfig(mode="checkpoint", folder="memory://jaxpod_transfer_units", keep_n=1)
  params = {"w": jnp.arange(12.0).reshape(3, 4), "b": jnp.ones(4, jnp.bfloat16)}
  like = flatten.abstract(params)
  with create_server(cfg) as server, create_client(cfg) as client:
    assert client.receive(like) is None
    server.publish(3, params)
    server.publish(4, jax.tree_util.tree_map(lambda x: x + 1, params))
    update = client.receive(like)
    assert update.weight_id == 4 and client.receive(like) is None
    np.testing.assert_array_equal(np.asarray(update.params["w"]), np.arange(12.0).reshape(3, 4) + 1)
    assert update.params["b"].dtype == jnp.bfloat16


def test_publish_hook_runs_under_the_trainers_hook_loop():
  """PublishWeightsHook satisfies jaxpod.train.hooks' interface (run_hooks + StepInfo)."""
  hooks = pytest.importorskip("jaxpod.train.hooks")
  published = []

  class FakeServer:
    def publish(self, step, params):
      published.append((step, params))

  hook = PublishWeightsHook(FakeServer(), every=2)
  state = type("TrainState", (), {"params": {"w": 1}})()
  for step in (1, 2, 3):
    hooks.run_hooks([hook], hooks.StepInfo(step=step, state=state, final=step == 3, run_dir="", mesh=None))
  assert published == [(2, {"w": 1}), (3, {"w": 1})]


def test_flight_serves_the_trainers_buffers_without_a_copy_and_survives_donation(tmp_path):
  """arrow_flight keeps a numpy view of the published jax buffer (no copy); the trainer's next step
  donating that array does not overwrite it (JAX skips donating a buffer with an external
  reference), so the client still receives the published values."""
  from jaxpod.transfer import create_client, create_server
  cfg = TransferConfig(mode="arrow_flight", coordinator="filesystem", folder=str(tmp_path / "w"), keep_n=1)
  x = jnp.arange(4096.0, dtype=jnp.float32).reshape(64, 64)
  step = jax.jit(lambda a: a * 2 + 1, donate_argnums=0)
  with create_server(cfg) as server, create_client(cfg) as client:
    server.publish(1, {"w": x})
    (served,) = server.versions[max(server.versions)]
    assert served.ctypes.data == x.unsafe_buffer_pointer()  # zero-copy: the trainer's own buffer
    y = jax.block_until_ready(step(x))  # the trainer's next step donates its params
    jax.block_until_ready([jnp.zeros((64, 64)) for _ in range(8)])  # reuse any freed memory
    update = client.receive({"w": jax.ShapeDtypeStruct((64, 64), jnp.float32)})
    np.testing.assert_array_equal(np.asarray(update.params["w"]), np.arange(4096.0).reshape(64, 64))
    np.testing.assert_array_equal(np.asarray(y), np.arange(4096.0).reshape(64, 64) * 2 + 1)


def test_ensure_secret_keeps_a_set_secret_and_makes_a_new_one_otherwise():
  from jaxpod.transfer import secrets
  made = secrets.ensure_secret({"PATH": "/bin"})
  assert len(made[secrets.SECRET_ENV]) >= secrets.MIN_CHARS and made["PATH"] == "/bin"
  assert secrets.ensure_secret(made) == made  # a run keeps its secret
  assert secrets.ensure_secret({})[secrets.SECRET_ENV] != made[secrets.SECRET_ENV]
  assert [secrets.is_loopback(h) for h in ("127.0.0.1", "localhost", "::1", "::ffff:127.0.0.1", "0.0.0.0", "::",
                                                "10.0.0.2", "vm")] == [True] * 4 + [False] * 4


def test_flight_off_host_needs_the_runs_secret_and_refuses_other_clients(tmp_path, monkeypatch, caplog, capfd):
  """Security: an arrow_flight server bound off-host does not start without the run's secret (a
  one-line error naming the variable and how to make one); with it, a client without the secret
  or with another one is refused (TransferAuthError), a client with it receives, and the secret
  appears in no log line or output of either side."""
  import logging

  from jaxpod.transfer import TransferAuthError, create_client, create_server, secrets
  caplog.set_level(logging.DEBUG)
  var = secrets.SECRET_ENV
  cfg = TransferConfig(mode="arrow_flight", coordinator="filesystem", folder=str(tmp_path / "w"), num_servers=1,
                       bind_address="0.0.0.0", advertise_address="127.0.0.1")
  monkeypatch.delenv(var, raising=False)
  with pytest.raises(ValueError, match=f"{var}.*secrets.token_urlsafe") as missing:
    create_server(cfg)
  assert "\n" not in str(missing.value) and not (tmp_path / "w").exists()  # nothing started
  run_secret = secrets.new_secret()
  monkeypatch.setenv(var, run_secret)
  params = {"w": jnp.arange(64.0).reshape(8, 8)}
  like = flatten.abstract(params)
  with create_server(cfg) as server:
    server.publish(1, params)
    for client_secret in (None, secrets.new_secret()):  # none, then another run's
      if client_secret is None:
        monkeypatch.delenv(var)
        client_cfg = TransferConfig(**{**cfg.__dict__, "bind_address": "127.0.0.1"})  # a loopback-configured client
      else:
        monkeypatch.setenv(var, client_secret)
        client_cfg = cfg
      with create_client(client_cfg) as client, pytest.raises(TransferAuthError, match=f"refused.*{var}"):
        client.receive(like)
    monkeypatch.setenv(var, run_secret)
    with create_client(cfg) as client:
      update = client.receive(like)
    np.testing.assert_array_equal(np.asarray(update.params["w"]), np.arange(64.0).reshape(8, 8))
  out, err = capfd.readouterr()
  assert run_secret not in out + err + caplog.text + repr(cfg)


@pytest.mark.parametrize("family", ["qwen2", "gemma3_text"])
def test_every_family_parameter_crosses_the_wire(hf_family, family):
  """A family model's whole state (Qwen2's q/k/v biases, Gemma 3's q/k and sandwich norms) flattens into named
  pieces and reassembles, sharded on another mesh, to the same model: same logits as before the transfer."""
  from flax import nnx
  from jaxpod.models.llama import hf_io
  from jaxpod.runtime import make_mesh, state_shardings
  folder, _ = hf_family(family)
  model = hf_io.load(folder, make_mesh(data=4, devices=jax.devices()[:4]))
  graphdef, params = nnx.split(model)
  names = {n for n, _ in flatten.leaf_names(params)}
  assert any(("bias" if family == "qwen2" else "post_feedforward_layernorm") in n for n in names), names
  table, pieces = flatten.to_pieces(params)
  dst = state_shardings(params, make_mesh(data=2, model=2, devices=jax.devices()[4:8]))  # as a rollout worker's
  like = jax.tree.unflatten(jax.tree.structure(params), [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh)
                                                         for a, sh in zip(jax.tree.leaves(params), jax.tree.leaves(dst))])
  asm = flatten.Assembler(table, like)
  for p in pieces:
    asm.put_bytes(p.meta(), p.data.tobytes())
  got = asm.finish()
  tokens = np.arange(40, dtype=np.int32).reshape(2, 20) % 300
  fwd = lambda p: np.asarray(jax.jit(lambda p, t: nnx.merge(graphdef, p)(t).logits)(p, tokens))  # noqa: E731
  np.testing.assert_array_equal(fwd(jax.device_get(got)), fwd(jax.device_get(params)))
