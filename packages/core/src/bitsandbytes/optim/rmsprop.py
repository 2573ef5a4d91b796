"""RMSprop (no momentum, not centered), 32-bit or 8-bit blockwise state."""

from __future__ import annotations

from .optimizer import Optimizer1State

__all__ = ["RMSprop", "RMSprop8bit", "RMSprop32bit"]


def _check(cls: type, alpha, momentum, centered) -> None:
    if alpha == 0:
        raise NotImplementedError(f"{cls.__name__} with alpha == 0 is not supported")
    if centered:
        raise NotImplementedError(f"{cls.__name__}: centered RMSprop is not supported")
    # The kernel has no momentum term; upstream passed momentum along and ignored it.
    if momentum != 0:
        raise NotImplementedError(f"{cls.__name__} with momentum != 0 is not supported")


class RMSprop(Optimizer1State):
    """RMSprop; ``optim_bits`` (32 or 8) picks the state precision."""

    def __init__(
        self, params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0, momentum=0, centered=False, optim_bits=32,
        args=None, min_8bit_size=4096, percentile_clipping=100, block_wise=True,
    ):  # fmt: skip
        _check(type(self), alpha, momentum, centered)
        super().__init__(
            "rmsprop", params, lr, (alpha, momentum), eps, weight_decay, optim_bits, args, min_8bit_size,
            percentile_clipping=percentile_clipping, block_wise=block_wise,
        )  # fmt: skip


class RMSprop8bit(Optimizer1State):
    """RMSprop with 8-bit blockwise state."""

    def __init__(
        self, params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0, momentum=0, centered=False, args=None,
        min_8bit_size=4096, percentile_clipping=100, block_wise=True,
    ):  # fmt: skip
        _check(type(self), alpha, momentum, centered)
        super().__init__(
            "rmsprop", params, lr, (alpha, momentum), eps, weight_decay, 8, args, min_8bit_size,
            percentile_clipping=percentile_clipping, block_wise=block_wise,
        )  # fmt: skip


class RMSprop32bit(Optimizer1State):
    """RMSprop with 32-bit state."""

    def __init__(
        self, params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0, momentum=0, centered=False, args=None,
        min_8bit_size=4096, percentile_clipping=100, block_wise=True,
    ):  # fmt: skip
        _check(type(self), alpha, momentum, centered)
        super().__init__(
            "rmsprop", params, lr, (alpha, momentum), eps, weight_decay, 32, args, min_8bit_size,
            percentile_clipping=percentile_clipping, block_wise=block_wise,
        )  # fmt: skip
