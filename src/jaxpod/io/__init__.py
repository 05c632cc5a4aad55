"""jaxpod.io: checkpoints (Orbax, global resume, commit manifests) and shard storage.

    ckpt = Checkpointer(CheckpointConfig(dir="runs/x/checkpoints", keep_last=2))
    ckpt.save(step, state_tree, data_state)          # every host; async
    restored = ckpt.restore(target_tree)             # (step, tree, data_state) or None
"""
from jaxpod.io.checkpoints import CheckpointConfig, Checkpointer, verify_step, write_manifest
