"""AdamWW (AdamW with decoupled weight decay, 1e-2 by default) with 32-bit or 8-bit blockwise state."""

from __future__ import annotations

from ._args import fixed_bits, no_amsgrad
from .optimizer import Optimizer2State

__all__ = ["AdamW", "AdamW8bit", "AdamW32bit", "PagedAdamW", "PagedAdamW8bit", "PagedAdamW32bit"]


class AdamW(Optimizer2State):
    """AdamW; ``optim_bits`` (32 or 8) picks the state precision, ``is_paged`` paged state."""

    def __init__(
        self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, optim_bits=32,
        args=None, min_8bit_size=4096, is_paged=False, percentile_clipping=100, block_wise=True,
    ):  # fmt: skip
        no_amsgrad(type(self), amsgrad)
        super().__init__(
            "adam", params, lr, betas, eps, weight_decay, optim_bits, args, min_8bit_size, is_paged=is_paged,
            percentile_clipping=percentile_clipping, block_wise=block_wise,
        )  # fmt: skip


class AdamW8bit(Optimizer2State):
    """AdamW with 8-bit blockwise state."""

    def __init__(
        self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, optim_bits=32,
        args=None, min_8bit_size=4096, is_paged=False, percentile_clipping=100, block_wise=True,
    ):  # fmt: skip
        no_amsgrad(type(self), amsgrad)
        fixed_bits(type(self), optim_bits)
        super().__init__(
            "adam", params, lr, betas, eps, weight_decay, 8, args, min_8bit_size, is_paged=is_paged,
            percentile_clipping=percentile_clipping, block_wise=block_wise,
        )  # fmt: skip


class AdamW32bit(Optimizer2State):
    """AdamW with 32-bit state."""

    def __init__(
        self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, optim_bits=32,
        args=None, min_8bit_size=4096, is_paged=False, percentile_clipping=100, block_wise=True,
    ):  # fmt: skip
        no_amsgrad(type(self), amsgrad)
        super().__init__(
            "adam", params, lr, betas, eps, weight_decay, 32, args, min_8bit_size, is_paged=is_paged,
            percentile_clipping=percentile_clipping, block_wise=block_wise,
        )  # fmt: skip


class PagedAdamW(Optimizer2State):
    """AdamW with paged state (``optim_bits`` 32 or 8)."""

    def __init__(
        self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, optim_bits=32,
        args=None, min_8bit_size=4096, percentile_clipping=100, block_wise=True,
    ):  # fmt: skip
        no_amsgrad(type(self), amsgrad)
        super().__init__(
            "adam", params, lr, betas, eps, weight_decay, optim_bits, args, min_8bit_size, is_paged=True,
            percentile_clipping=percentile_clipping, block_wise=block_wise,
        )  # fmt: skip


class PagedAdamW8bit(Optimizer2State):
    """AdamW with paged 8-bit blockwise state."""

    def __init__(
        self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, optim_bits=32,
        args=None, min_8bit_size=4096, percentile_clipping=100, block_wise=True,
    ):  # fmt: skip
        no_amsgrad(type(self), amsgrad)
        fixed_bits(type(self), optim_bits)
        super().__init__(
            "adam", params, lr, betas, eps, weight_decay, 8, args, min_8bit_size, is_paged=True,
            percentile_clipping=percentile_clipping, block_wise=block_wise,
        )  # fmt: skip


class PagedAdamW32bit(Optimizer2State):
    """AdamW with paged 32-bit state."""

    def __init__(
        self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, optim_bits=32,
        args=None, min_8bit_size=4096, percentile_clipping=100, block_wise=True,
    ):  # fmt: skip
        no_amsgrad(type(self), amsgrad)
        super().__init__(
            "adam", params, lr, betas, eps, weight_decay, 32, args, min_8bit_size, is_paged=True,
            percentile_clipping=percentile_clipping, block_wise=block_wise,
        )  # fmt: skip
