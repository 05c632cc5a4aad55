"""Invariant 10 for weight publishing: every trainer host serves its share, off the training step."""
from __future__ import annotations

import os
import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np

from jaxpod.transfer import TransferConfig, checkpoint, create_client, flatten
from jaxpod.transfer.hooks import PublishWeightsHook

WORKERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers")


def test_a_replicated_model_is_served_by_every_host_in_equal_shares(launch_hosts, bucket):
  """Invariant 10 (and 4, 9): with parameters replicated across 2 hosts (data over hosts, fsdp within),
  each host serves about half of every version (replica 0 alone would put all of it on host 0), every
  element goes on the wire once, and the background publish delivers each version whole: the snapshot
  taken before a donating step, and nothing visible before its commit."""
  sys.path.insert(0, WORKERS)
  import spread_publish
  folder = f"{bucket}/weights"
  result = launch_hosts(os.path.join(WORKERS, "spread_publish.py"), hosts=2, devices_per_host=2, args=[folder],
                        timeout_s=180)
  assert result.returncode == 0, result.all_output[-4000:]
  total = sum(v.nbytes for v in spread_publish.expected(0).values())
  for seq in (1, 2):
    served = [int(line.split()[2]) for i in range(2) for line in result.output[i] if line.startswith(f"SERVED {seq} ")]
    assert len(served) == 2 and sum(served) == total, served
    assert max(served) / (total / 2) <= 1.25, served
  assert [line for i in range(2) for line in result.output[i] if line.startswith("VISIBLE")] == ["VISIBLE False"] * 2
  want = spread_publish.expected(1)  # version 2 = the params after one step
  like = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in want.items()}
  with create_client(TransferConfig(mode="checkpoint", folder=folder)) as client:
    update = client.receive(like)
  assert update.weight_id == 2
  for k, v in want.items():
    np.testing.assert_array_equal(np.asarray(update.params[k]), v)


class UploadHeldUntilReleased(checkpoint.Server):
  """Test double around the real checkpoint transport: its upload waits for `release`, as a slow
  bucket upload would, so the test sees what the trainer does while the bytes are in flight."""

  release = threading.Event()

  def _stage(self, *args, **kwargs):
    assert self.release.wait(60), "the test never released the upload"
    return super()._stage(*args, **kwargs)


def test_background_publish_returns_before_the_upload_ends_and_commits_at_the_next_call():
  """The train step does not wait for the upload: `hook(step)` returns while version 1's bytes are still
  held back, a donating step runs, and version 1 (the snapshot, not the stepped params) is committed
  at the next call; `close` commits the last version."""
  cfg = TransferConfig(mode="checkpoint", folder="memory://jaxpod_publish_share", keep_n=2)
  params = {"w": jnp.arange(12.0).reshape(3, 4), "b": jnp.ones(4)}
  like = flatten.abstract(params)
  hook = PublishWeightsHook(UploadHeldUntilReleased(cfg), every=1, background=True)
  UploadHeldUntilReleased.release.clear()
  assert hook(1, params) is None  # returned with the upload still held
  assert not hook.pending.uploaded() and hook.server.coord.latest() is None
  params = jax.jit(lambda p: jax.tree_util.tree_map(lambda x: x + 1, p), donate_argnums=0)(params)
  UploadHeldUntilReleased.release.set()
  out = hook(2, params)  # commits version 1, starts version 2
  assert set(out) >= {"transfer/publish_s", "transfer/publish_wait_s"}
  with create_client(cfg) as client:
    first = client.receive(like)
    np.testing.assert_array_equal(np.asarray(first.params["w"]), np.arange(12.0).reshape(3, 4))
    hook.close()
    second = client.receive(like)
  assert (first.weight_id, second.weight_id) == (1, 2)
  np.testing.assert_array_equal(np.asarray(second.params["w"]), np.arange(12.0).reshape(3, 4) + 1)
