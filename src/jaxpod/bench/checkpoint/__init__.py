"""`jaxpod bench checkpoint` (`command.py`): what one checkpoint (`jaxpod.io.Checkpointer`) costs the training loop."""
