"""Optimizer steps on the cpu: ``optimizer_update_32bit`` and ``optimizer_update_8bit_blockwise``, all 8 names.

The core's checks run first, so a bad call raises before anything is written. g, p and the states are
contiguous (checked); the small tensors the checks leave free (qmaps, absmax) are made contiguous here, an
absmax written back to its own storage afterwards.
"""

from __future__ import annotations

import torch

from bitsandbytes._ops import (
    TWO_STATE_OPTIMIZERS,
    check_optimizer_update_8bit_blockwise,
    check_optimizer_update_32bit,
)
from bitsandbytes._reference import REFERENCE

from ._capsules import native as _C
from ._maps import holds_nan
from ._threads import threads


@torch.no_grad()
def optimizer_update_32bit(
    optimizer_name, g, p, state1, state2, unorm_vec, max_unorm, param_norm, beta1, beta2, beta3, alpha, eps,
    weight_decay, step, lr, gnorm_scale, skip_zeros=False,
) -> None:  # fmt: skip
    check_optimizer_update_32bit(optimizer_name, g, p, state1, state2, unorm_vec, max_unorm, param_norm, beta1, beta2,
                                 beta3, alpha, eps, weight_decay, step, lr, gnorm_scale, skip_zeros)  # fmt: skip
    two_states = optimizer_name in TWO_STATE_OPTIMIZERS
    unorm = unorm_vec if max_unorm > 0 else None
    _C.optimizer_update_32bit(
        optimizer_name, g, p, state1, state2 if two_states else None, unorm, float(max_unorm), float(param_norm),
        float(beta1), float(beta2), float(beta3), float(alpha), float(eps), float(weight_decay), int(step), float(lr),
        float(gnorm_scale), bool(skip_zeros), threads(),
    )  # fmt: skip


@torch.no_grad()
def optimizer_update_8bit_blockwise(
    optimizer_name, g, p, state1, state2, beta1, beta2, beta3, alpha, eps,
    step, lr, qmap1, qmap2, absmax1, absmax2, weight_decay, gnorm_scale, skip_zeros=False,
) -> None:  # fmt: skip
    # The schema's 19 parameters, in its order (the core declares them; every backend repeats them).
    args = (optimizer_name, g, p, state1, state2, beta1, beta2, beta3, alpha, eps, step, lr, qmap1, qmap2, absmax1,
            absmax2, weight_decay, gnorm_scale, skip_zeros)  # fmt: skip
    check_optimizer_update_8bit_blockwise(*args)
    if p.numel() == 0:
        return
    if optimizer_name not in TWO_STATE_OPTIMIZERS:
        state2 = qmap2 = absmax2 = None  # one-state optimizers leave them untouched
    if holds_nan(qmap1, qmap2):
        REFERENCE["optimizer_update_8bit_blockwise"](*args)
        return
    a1 = absmax1.contiguous()
    a2 = absmax2.contiguous() if absmax2 is not None else None
    _C.optimizer_update_8bit_blockwise(
        optimizer_name, g, p, state1, state2, float(beta1), float(beta2), float(beta3), float(alpha), float(eps),
        int(step), float(lr), qmap1.contiguous(), qmap2.contiguous() if qmap2 is not None else None, a1, a2,
        float(weight_decay), float(gnorm_scale), bool(skip_zeros), threads(),
    )  # fmt: skip
    if a1 is not absmax1:
        absmax1.copy_(a1)
    if a2 is not None and a2 is not absmax2:
        absmax2.copy_(a2)


OPS = {
    "optimizer_update_32bit": optimizer_update_32bit,
    "optimizer_update_8bit_blockwise": optimizer_update_8bit_blockwise,
}
