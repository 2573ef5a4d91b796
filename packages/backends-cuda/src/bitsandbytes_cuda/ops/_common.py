"""Helpers shared by the op modules: kernel-name suffixes per dtype and 1-D launch geometry."""

from __future__ import annotations

import functools

from bitsandbytes.backends.kit import dtype_suffix

__all__ = ["elementwise_grid", "rows_cols_geometry", "suffix"]

# torch dtype -> the suffix the tables give a kernel instantiated for it; TypeError naming CUDA otherwise.
suffix = functools.partial(dtype_suffix, kernels="CUDA")

# Enough blocks of 256 to fill any current GPU many times over; grid-stride loops cover the rest.
_MAX_BLOCKS = 65536


def elementwise_grid(n: int, threads: int = 256) -> int:
    """Blocks for a grid-stride loop over ``n`` elements (n > 0)."""
    return max(1, min((n + threads - 1) // threads, _MAX_BLOCKS))


def rows_cols_geometry(rows: int, cols: int, threads: int = 256) -> tuple[tuple[int, int], int]:
    """(grid, block) for the kernels whose lanes own a column and stride the rows (rows, cols > 0):
    grid.x tiles the columns, grid.y (at most 65535) strides the rows; narrow matrices get small blocks."""
    block = min(threads, (cols + 31) // 32 * 32)
    return ((cols + block - 1) // block, min(rows, 65535)), block
