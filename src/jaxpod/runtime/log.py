"""Host-prefixed logging: every line says which host wrote it (`[host 2/4] ...`)."""
from __future__ import annotations

import logging
import sys

LOGGER_NAME = "jaxpod"
_HANDLER_TAG = "_jaxpod_handler"


def setup_logging(label: str, level: str = "INFO") -> logging.Logger:
  """Install one stderr handler on the `jaxpod` logger that prefixes `[label]`."""
  logger = logging.getLogger(LOGGER_NAME)
  for h in list(logger.handlers):
    if getattr(h, _HANDLER_TAG, False):
      logger.removeHandler(h)
  handler = logging.StreamHandler(sys.stderr)
  setattr(handler, _HANDLER_TAG, True)
  handler.setFormatter(logging.Formatter(f"[{label}] %(levelname).1s %(asctime)s %(name)s: %(message)s",
                                         datefmt="%H:%M:%S"))
  logger.addHandler(handler)
  logger.setLevel(level.upper())
  logger.propagate = False
  return logger


def get_logger(name: str) -> logging.Logger:
  """A child of the jaxpod logger (`jaxpod.<name>`)."""
  return logging.getLogger(f"{LOGGER_NAME}.{name.removeprefix(LOGGER_NAME + '.')}")
