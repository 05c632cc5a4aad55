"""jaxpod.models.trm: the Tiny Recursive Model (Jolicoeur-Martineau, 2025) in Flax NNX.

Public interface (everything a trainer needs):
    cfg = TRMConfig.sudoku_mlp()                      # or load_configs("configs/trm_sudoku_mlp.yaml")
    model = TRM(cfg, rngs=nnx.Rngs(0))                # or load_reference_state_dict(path, cfg)
    graphdef, params, buffers = split_model(model)    # once, outside the hot loop
    carry = init_carry(cfg, global_batch)
    grad_fn = jax.value_and_grad(train_loss, argnums=1, has_aux=True)
    (loss_scaled, (carry, outputs, metrics)), grads = grad_fn(graphdef, params, buffers, carry, batch, rng)
    tx = make_optimizer(TRMOptimConfig()); updates, opt_state = tx.update(grads, opt_state, params)
Metrics are raw sums; `normalize_metrics` gives what the reference logs. `train_loss` divides the
loss by the (global) batch rows, as the reference does; a global gradient then sums over hosts.
To train: `params` with AdamATan2 + SignSGD (puzzle table); `buffers` (H_init, L_init) never change.
"""
from jaxpod.models.trm.config import TRMConfig, TRMOptimConfig, load_configs, swiglu_width
from jaxpod.models.trm.flops import count_params, step_flops
from jaxpod.models.trm.interop import export_reference_state_dict, load_reference_state_dict, load_state_dict_into
from jaxpod.models.trm.layers import Buffer, PuzzleEmbedding
from jaxpod.models.trm.loss import (IGNORE_LABEL_ID, act_loss, eval_step, normalize_eval_metrics, normalize_metrics,
                                    softmax_cross_entropy, stablemax_cross_entropy, train_loss)
from jaxpod.models.trm.model import BATCH_KEYS, TRM, TRMCarry, act_step, init_carry, reset_carry, split_model
from jaxpod.models.trm.optim import adam_atan2, make_optimizer, param_labels, sign_sgd, warmup_schedule
