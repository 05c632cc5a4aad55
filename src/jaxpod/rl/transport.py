"""The weight transport between a disaggregated trainer and its rollout workers (`jaxpod.transfer`).

`transfer.folder` may be relative: it is then inside the run folder (default `weights/`), so the
trainer and every worker of a run find the publications from the run alone. The default mode is
`checkpoint` with the filesystem coordinator: both live in the run's shared storage (a bucket),
so the two jobs need nothing else in common and either may restart.
"""
from __future__ import annotations

import dataclasses

from jaxpod.runtime import storage


def transfer_config(rl, run_dir: str):
  """`rl.transfer` with a relative folder placed inside the run folder."""
  t = rl.transfer
  folder = t.folder
  if folder and "://" not in folder and not folder.startswith("/"):
    folder = storage.join(run_dir, folder)
  return dataclasses.replace(t, folder=folder)


def describe(rl, run_dir: str) -> str:
  """Where a worker looks for the trainer's publications (for error messages)."""
  t = transfer_config(rl, run_dir)
  where = t.folder if t.coordinator == "filesystem" else f"the {t.coordinator} coordinator {t.name!r}"
  return f"{t.mode} transfer at {where}"
