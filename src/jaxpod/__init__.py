"""jaxpod: multi-host JAX, correct by construction."""
__version__ = "0.1.0"
