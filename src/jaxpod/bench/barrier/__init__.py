"""`jaxpod bench barrier` (`command.py`): the runtime's barrier against the raw coordination-service barrier and a
device collective, on every host of a launch."""
