"""Adagrad (no lr decay, zero initial accumulator), 32-bit or 8-bit blockwise state."""

from __future__ import annotations

from ._args import fixed_bits
from .optimizer import Optimizer1State

__all__ = ["Adagrad", "Adagrad8bit", "Adagrad32bit"]


def _check(lr_decay, initial_accumulator_value) -> None:
    if initial_accumulator_value != 0.0:
        raise ValueError("initial_accumulator_value != 0.0 is not supported")
    if lr_decay != 0.0:
        raise ValueError("lr_decay != 0.0 is not supported")


class Adagrad(Optimizer1State):
    """Adagrad; ``optim_bits`` (32 or 8) picks the state precision."""

    def __init__(
        self, params, lr=1e-2, lr_decay=0, weight_decay=0, initial_accumulator_value=0, eps=1e-10, optim_bits=32,
        args=None, min_8bit_size=4096, percentile_clipping=100, block_wise=True,
    ):  # fmt: skip
        _check(lr_decay, initial_accumulator_value)
        super().__init__(
            "adagrad", params, lr, (0.0, 0.0), eps, weight_decay, optim_bits, args, min_8bit_size,
            percentile_clipping=percentile_clipping, block_wise=block_wise,
        )  # fmt: skip


class Adagrad8bit(Optimizer1State):
    """Adagrad with 8-bit blockwise state."""

    def __init__(
        self, params, lr=1e-2, lr_decay=0, weight_decay=0, initial_accumulator_value=0, eps=1e-10, optim_bits=8,
        args=None, min_8bit_size=4096, percentile_clipping=100, block_wise=True,
    ):  # fmt: skip
        _check(lr_decay, initial_accumulator_value)
        fixed_bits(type(self), optim_bits, 8)
        super().__init__(
            "adagrad", params, lr, (0.0, 0.0), eps, weight_decay, 8, args, min_8bit_size,
            percentile_clipping=percentile_clipping, block_wise=block_wise,
        )  # fmt: skip


class Adagrad32bit(Optimizer1State):
    """Adagrad with 32-bit state."""

    def __init__(
        self, params, lr=1e-2, lr_decay=0, weight_decay=0, initial_accumulator_value=0, eps=1e-10, optim_bits=32,
        args=None, min_8bit_size=4096, percentile_clipping=100, block_wise=True,
    ):  # fmt: skip
        _check(lr_decay, initial_accumulator_value)
        super().__init__(
            "adagrad", params, lr, (0.0, 0.0), eps, weight_decay, 32, args, min_8bit_size,
            percentile_clipping=percentile_clipping, block_wise=block_wise,
        )  # fmt: skip
