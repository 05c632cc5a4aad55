"""`jaxpod bench sample` (`command.py`): jaxpod's engines against HF generate, each side in a child process of
`engines.py`; the RL-rollout and episodes workloads and the occupancy plot in `rollout.py`."""
