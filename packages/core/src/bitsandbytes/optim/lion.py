"""Lion (sign of an interpolated momentum; decoupled weight decay), 32-bit or 8-bit blockwise state."""

from __future__ import annotations

from .optimizer import Optimizer1State

__all__ = ["Lion", "Lion8bit", "Lion32bit", "PagedLion", "PagedLion8bit", "PagedLion32bit"]


class Lion(Optimizer1State):
    """Lion; ``optim_bits`` (32 or 8) picks the state precision, ``is_paged`` paged state."""

    def __init__(
        self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0, optim_bits=32, args=None, min_8bit_size=4096,
        is_paged=False, percentile_clipping=100, block_wise=True,
    ):  # fmt: skip
        super().__init__(
            "lion", params, lr, betas, 0.0, weight_decay, optim_bits, args, min_8bit_size, is_paged=is_paged,
            percentile_clipping=percentile_clipping, block_wise=block_wise,
        )  # fmt: skip


class Lion8bit(Optimizer1State):
    """Lion with 8-bit blockwise state."""

    def __init__(
        self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0, args=None, min_8bit_size=4096, is_paged=False,
        percentile_clipping=100, block_wise=True,
    ):  # fmt: skip
        super().__init__(
            "lion", params, lr, betas, 0.0, weight_decay, 8, args, min_8bit_size, is_paged=is_paged,
            percentile_clipping=percentile_clipping, block_wise=block_wise,
        )  # fmt: skip


class Lion32bit(Optimizer1State):
    """Lion with 32-bit state."""

    def __init__(
        self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0, args=None, min_8bit_size=4096, is_paged=False,
        percentile_clipping=100, block_wise=True,
    ):  # fmt: skip
        super().__init__(
            "lion", params, lr, betas, 0.0, weight_decay, 32, args, min_8bit_size, is_paged=is_paged,
            percentile_clipping=percentile_clipping, block_wise=block_wise,
        )  # fmt: skip


class PagedLion(Optimizer1State):
    """Lion with paged state (``optim_bits`` 32 or 8)."""

    def __init__(
        self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0, optim_bits=32, args=None, min_8bit_size=4096,
        percentile_clipping=100, block_wise=True,
    ):  # fmt: skip
        super().__init__(
            "lion", params, lr, betas, 0.0, weight_decay, optim_bits, args, min_8bit_size, is_paged=True,
            percentile_clipping=percentile_clipping, block_wise=block_wise,
        )  # fmt: skip


class PagedLion8bit(Optimizer1State):
    """Lion with paged 8-bit blockwise state."""

    def __init__(
        self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0, args=None, min_8bit_size=4096,
        percentile_clipping=100, block_wise=True,
    ):  # fmt: skip
        super().__init__(
            "lion", params, lr, betas, 0.0, weight_decay, 8, args, min_8bit_size, is_paged=True,
            percentile_clipping=percentile_clipping, block_wise=block_wise,
        )  # fmt: skip


class PagedLion32bit(Optimizer1State):
    """Lion with paged 32-bit state."""

    def __init__(
        self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0, args=None, min_8bit_size=4096,
        percentile_clipping=100, block_wise=True,
    ):  # fmt: skip
        super().__init__(
            "lion", params, lr, betas, 0.0, weight_decay, 32, args, min_8bit_size, is_paged=True,
            percentile_clipping=percentile_clipping, block_wise=block_wise,
        )  # fmt: skip
