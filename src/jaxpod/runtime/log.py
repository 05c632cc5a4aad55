"""Host-prefixed logging: every line says which host wrote it (`[host 2/4] ...`), once.

Under `jaxpod launch` the launcher already prefixes every output line with its host, so
the handler leaves the label out there (it would otherwise appear twice).
"""
from __future__ import annotations

import logging
import os
import sys

from jaxpod.runtime.hosts import ENV_PROCESS_ID

LOGGER_NAME = "jaxpod"
_HANDLER_TAG = "_jaxpod_handler"


def line_format(label: str, environ=os.environ) -> str:
  """The log line format: `[label] L HH:MM:SS name: message`, without the label under `jaxpod launch`."""
  prefix = "" if ENV_PROCESS_ID in environ else f"[{label}] "
  return prefix + "%(levelname).1s %(asctime)s %(name)s: %(message)s"


def setup_logging(label: str, level: str = "INFO") -> logging.Logger:
  """Install one stderr handler on the `jaxpod` logger that prefixes `[label]` (unless launched)."""
  logger = logging.getLogger(LOGGER_NAME)
  for h in list(logger.handlers):
    if getattr(h, _HANDLER_TAG, False):
      logger.removeHandler(h)
  handler = logging.StreamHandler(sys.stderr)
  setattr(handler, _HANDLER_TAG, True)
  handler.setFormatter(logging.Formatter(line_format(label), datefmt="%H:%M:%S"))
  logger.addHandler(handler)
  logger.setLevel(level.upper())
  logger.propagate = False
  return logger


def get_logger(name: str) -> logging.Logger:
  """A child of the jaxpod logger (`jaxpod.<name>`)."""
  return logging.getLogger(f"{LOGGER_NAME}.{name.removeprefix(LOGGER_NAME + '.')}")
