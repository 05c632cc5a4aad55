"""jaxpod.io: checkpoints (Orbax straight to a URL, global resume, joint fall-back from a damaged step) and
row stores (jaxpod.io.rows: the leader writes an array once in chunks with a sha256 each; every host reads
and verifies only its rows).

    ckpt = Checkpointer(CheckpointConfig(dir="gs://bucket/runs/x/checkpoints", keep_last=2))
    ckpt.save(step, state_tree, data_state)          # every host; async
    restored = ckpt.restore(target_tree)             # (step, tree, data_state) or None
    verify("gs://bucket/runs/x/checkpoints")         # [(step, None or error)]: reads every byte
"""
from jaxpod.io.checkpoints import CheckpointConfig, CheckpointMismatch, Checkpointer, verify
