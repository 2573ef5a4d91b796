"""LAMB: Adam whose update is limited by a trust ratio, ``max_unorm * ||p||`` (32-bit state only).

The 8-bit kernels have no trust ratio, so with 8-bit state LAMB steps as Adam (as upstream).
"""

from __future__ import annotations

from ._args import no_amsgrad
from .optimizer import Optimizer2State

__all__ = ["LAMB", "LAMB8bit", "LAMB32bit"]


def _check_unsupported(cls: type, bias_correction, adam_w_mode) -> None:
    # Upstream accepted and ignored these; the kernels always bias-correct and decay as AdamW.
    if not bias_correction:
        raise ValueError(f"{cls.__name__} does not support bias_correction=False")
    if not adam_w_mode:
        raise ValueError(f"{cls.__name__} does not support adam_w_mode=False")


class LAMB(Optimizer2State):
    """LAMB; ``optim_bits`` (32 or 8) picks the state precision."""

    def __init__(
        self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False,
        adam_w_mode=True, optim_bits=32, args=None, min_8bit_size=4096, max_unorm=1.0, percentile_clipping=100,
        block_wise=False,
    ):  # fmt: skip
        no_amsgrad(type(self), amsgrad)
        _check_unsupported(type(self), bias_correction, adam_w_mode)
        super().__init__(
            "lamb", params, lr, betas, eps, weight_decay, optim_bits, args, min_8bit_size, max_unorm=max_unorm,
            percentile_clipping=percentile_clipping, block_wise=block_wise,
        )  # fmt: skip


class LAMB8bit(Optimizer2State):
    """LAMB with 8-bit blockwise state (no trust ratio: steps as Adam)."""

    def __init__(
        self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False,
        adam_w_mode=True, args=None, min_8bit_size=4096, max_unorm=1.0, percentile_clipping=100, block_wise=False,
    ):  # fmt: skip
        no_amsgrad(type(self), amsgrad)
        _check_unsupported(type(self), bias_correction, adam_w_mode)
        if max_unorm != 1.0:
            raise ValueError(f"{type(self).__name__} only supports max_unorm=1.0 (the default, kept for compatibility)")
        super().__init__(
            "lamb", params, lr, betas, eps, weight_decay, 8, args, min_8bit_size, max_unorm=max_unorm,
            percentile_clipping=percentile_clipping, block_wise=block_wise,
        )  # fmt: skip


class LAMB32bit(Optimizer2State):
    """LAMB with 32-bit state."""

    def __init__(
        self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False,
        adam_w_mode=True, args=None, min_8bit_size=4096, max_unorm=1.0, percentile_clipping=100, block_wise=False,
    ):  # fmt: skip
        no_amsgrad(type(self), amsgrad)
        _check_unsupported(type(self), bias_correction, adam_w_mode)
        super().__init__(
            "lamb", params, lr, betas, eps, weight_decay, 32, args, min_8bit_size, max_unorm=max_unorm,
            percentile_clipping=percentile_clipping, block_wise=block_wise,
        )  # fmt: skip
