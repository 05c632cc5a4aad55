"""`jaxpod bench preference` (`command.py`): preference training against TRL's trainers; each side trains in a
process of `side.py`."""
