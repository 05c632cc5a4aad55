"""`PendingPublish`: a weight version uploading in a background thread, committed on the caller's thread.

The server's `_upload` (device -> host copies and the transport's writes: bytes, no control plane)
runs in the thread; `result()` joins it and runs the server's `_finish` (the commit, a control-plane
step every host takes in the same order), so the coordination never leaves the trainer's thread.
"""
from __future__ import annotations

import threading
from typing import Any

from jaxpod.transfer.metrics import TransferMetrics


class PendingPublish:
  """A version being uploaded in the background; `result()` waits for the upload and commits it."""

  def __init__(self, server: Any, m: TransferMetrics, params: Any, multi: bool, thread: bool):
    self.server, self.m, self.multi = server, m, multi
    self._box: list = []
    self._thread = None
    if thread:
      self._thread = threading.Thread(target=self._run, args=(params,), name=f"publish-{m.weight_id}",
                                      daemon=True)
      self._thread.start()
    else:
      self._run(params)

  def _run(self, params: Any) -> None:
    try:
      self._box.append(self.server._upload(self.m, params))
    except BaseException as e:  # re-raised by result() on the caller's thread
      self._box.append(e)

  def uploaded(self) -> bool:
    """Whether the upload has ended (then `result()` only commits)."""
    return bool(self._box)

  def result(self) -> TransferMetrics:
    """Wait for the upload, then commit the version (a control-plane step every host takes)."""
    if self._thread is not None:
      self._thread.join()
    outcome = self._box[0]
    try:
      if isinstance(outcome, BaseException):
        raise outcome
      return self.server._finish(self.m, *outcome, self.multi)
    except Exception:
      self.server.totals.record(self.m, ok=False)
      raise
