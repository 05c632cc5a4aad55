"""What the disaggregated trainer publishes: its policy, every step, over `jaxpod.transfer`.

`transfer.folder` may be relative: it is then inside the run folder (default `weights/`), so the
trainer and every worker of a run find the publications from the run alone. The default mode is
`checkpoint` with the filesystem coordinator: both live in the run's shared storage (a bucket),
so the two jobs need nothing else in common and either may restart.

`PublishPolicy` (transfer's `PublishWeightsHook`, every step) publishes the starting version at `on_start`
(synchronously: the first batch needs it) and version k after step k. With `transfer.background` (RL's
default) version k uploads while step k+1 trains and is committed at the next publish (or at the end), so
the step never waits for the bytes and workers sample one version behind (`grpo.max_policy_lag` >= 1,
checked in the config); a version is reported only once committed, so a worker never waits on a version
the trainer already reported. The workers' side is `worker.py`
(`create_client` on the same config).
"""
from __future__ import annotations

import dataclasses

from jaxpod.runtime import storage
from jaxpod.runtime.hooks import StepInfo
from jaxpod.runtime.log import get_logger
from jaxpod.transfer.config import TransferConfig
from jaxpod.transfer.hooks import PublishWeightsHook

log = get_logger("rl.trainer")


def transfer_config(transfer: TransferConfig, run_dir: str) -> TransferConfig:
  """`transfer` with a relative folder placed inside the run folder."""
  folder = transfer.folder
  if folder and "://" not in folder and not folder.startswith("/"):
    folder = storage.join(run_dir, folder)
  return dataclasses.replace(transfer, folder=folder)


def describe(transfer: TransferConfig) -> str:
  """Where a worker looks for the trainer's publications (for error messages); `transfer` resolved."""
  if transfer.coordinator == "filesystem":
    return f"{transfer.mode} transfer at {transfer.folder}"
  return f"{transfer.mode} transfer at the {transfer.coordinator} coordinator {transfer.name!r}"


class PublishPolicy(PublishWeightsHook):
  """transfer's publish hook every step, and once at the start (the restored or first weights) as version `step`."""

  def __init__(self, transfer: TransferConfig):
    super().__init__(transfer, every=1)

  def on_start(self, info: StepInfo) -> dict | None:
    background, self.background = self.background, False  # workers need the first version for the first batch
    try:
      return self(info)
    finally:
      self.background = background

  def __call__(self, info: StepInfo) -> dict | None:
    out = super().__call__(info)
    if out is None:  # this version was published already
      return None
    m = self.history[-1]  # background: the version committed now (the previous one)
    log.info("published policy version %d (%.1f MB, %.3f s)", m["weight_id"], m["bytes"] / 1e6, m["seconds"])
    return {"rl/publish_s": out["transfer/publish_s"], "rl/publish_bytes": m["bytes"],
            **({"rl/publish_wait_s": out["transfer/publish_wait_s"]} if "transfer/publish_wait_s" in out else {})}
