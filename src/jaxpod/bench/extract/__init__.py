"""`jaxpod bench extract` (`command.py`): extraction tokens/s against transformers' `output_hidden_states`."""
