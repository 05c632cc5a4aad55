"""`jaxpod bench rl` (`command.py`): RL post-training per topology and weight-update mode; its sub-modes `--against
trl` (`against_trl.py`, with TRL's side in `trl_side.py` and the long workload in `long.py`), `--episodes`
(`episodes.py`) and `--step` (`step.py`, also the table after the arms). Run alone with `python -m`: `lora.py` (LoRA
engine modes and bytes per version) and `logprob_gap.py` (the sampler-trainer gap GRPO's corrections address)."""
