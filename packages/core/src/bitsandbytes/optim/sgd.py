"""SGD with momentum (coupled weight decay), 32-bit or 8-bit blockwise state."""

from __future__ import annotations

from .optimizer import Optimizer1State

__all__ = ["SGD", "SGD8bit", "SGD32bit"]


def _check(cls: type, lr, momentum, dampening, nesterov) -> None:
    if lr is None:
        raise TypeError(f"{cls.__name__} requires lr")
    if momentum == 0:
        raise NotImplementedError(f"{cls.__name__} without momentum is not supported")
    # The kernel implements neither; upstream accepted and ignored them.
    if dampening != 0:
        raise NotImplementedError(f"{cls.__name__} with dampening != 0 is not supported")
    if nesterov:
        raise NotImplementedError(f"{cls.__name__} with nesterov=True is not supported")


class SGD(Optimizer1State):
    """SGD with momentum; ``optim_bits`` (32 or 8) picks the state precision."""

    def __init__(
        self, params, lr, momentum=0, dampening=0, weight_decay=0, nesterov=False, optim_bits=32, args=None,
        min_8bit_size=4096, percentile_clipping=100, block_wise=True,
    ):  # fmt: skip
        _check(type(self), lr, momentum, dampening, nesterov)
        super().__init__(
            "momentum", params, lr, (momentum, dampening), 0.0, weight_decay, optim_bits, args, min_8bit_size,
            percentile_clipping=percentile_clipping, block_wise=block_wise,
        )  # fmt: skip


class SGD8bit(Optimizer1State):
    """SGD with momentum and 8-bit blockwise state."""

    def __init__(
        self, params, lr, momentum=0, dampening=0, weight_decay=0, nesterov=False, args=None, min_8bit_size=4096,
        percentile_clipping=100, block_wise=True,
    ):  # fmt: skip
        _check(type(self), lr, momentum, dampening, nesterov)
        super().__init__(
            "momentum", params, lr, (momentum, dampening), 0.0, weight_decay, 8, args, min_8bit_size,
            percentile_clipping=percentile_clipping, block_wise=block_wise,
        )  # fmt: skip


class SGD32bit(Optimizer1State):
    """SGD with momentum and 32-bit state."""

    def __init__(
        self, params, lr, momentum=0, dampening=0, weight_decay=0, nesterov=False, args=None, min_8bit_size=4096,
        percentile_clipping=100, block_wise=True,
    ):  # fmt: skip
        _check(type(self), lr, momentum, dampening, nesterov)
        super().__init__(
            "momentum", params, lr, (momentum, dampening), 0.0, weight_decay, 32, args, min_8bit_size,
            percentile_clipping=percentile_clipping, block_wise=block_wise,
        )  # fmt: skip
