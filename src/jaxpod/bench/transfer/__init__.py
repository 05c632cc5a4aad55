"""`jaxpod bench transfer` (`command.py`): weight transfer per mode; the trainer and client processes it starts are
`roles.py`."""
