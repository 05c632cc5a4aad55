"""`jaxpod bench scale` (`command.py`): per-host bytes and peak memory per phase on simulated hosts; each host is a
process of `host.py`."""
