"""What the quantizer ops share (ops/blockwise.py, ops/fourbit.py, gemm_4bit in ops/matmul_4bit.py), as
metal/quantize.h shares it between their kernels: the launch geometry of the quantizers and dequantizers
(what each kernel needs is stated above it in its .metal file), when a kernel serves a call, and a
tensor's bytes."""

from __future__ import annotations

import torch

from bitsandbytes import _checks

from ..tables._quantize import DEQUANT_ITEMS, DEQUANT_THREADS, QUANT_ITEMS, QUANT_MIN_THREADS
from ._common import native

__all__ = ["as_bytes", "dequantize_geometry", "quantize_geometry", "served"]


def served(kernel: str, threads: int = 0, blocksize: int | None = None) -> bool:
    """Whether ``kernel`` serves a call: it is loaded, ``threads`` fits 32-bit positions and ``blocksize``
    is one the kernels cover. Otherwise the op runs its reference kernel, on the same device."""
    return (blocksize is None or blocksize in _checks.BLOCKSIZES) and native(kernel, threads)


def quantize_geometry(n: int, blocksize: int) -> tuple[int, int]:
    """(threads, group_size) of a quantizer: blocksize / QUANT_ITEMS threads per quantization block,
    threadgroups of max(QUANT_MIN_THREADS, that) threads, as many as the blocks need."""
    group = blocksize // QUANT_ITEMS
    size = max(QUANT_MIN_THREADS, group)
    groups = _checks.n_blocks(_checks.n_blocks(n, blocksize), size // group)
    return groups * size, size


def dequantize_geometry(n: int) -> tuple[int, int]:
    """(threads, group_size) of a dequantizer: DEQUANT_ITEMS consecutive values per thread (n > 0), in whole
    threadgroups of DEQUANT_THREADS (a uniform grid: dequantize_blockwise copies its map with a stride of
    the threadgroup size, which a partial edge threadgroup would make Metal's choice; the threads past n
    return)."""
    return _checks.n_blocks(_checks.n_blocks(n, DEQUANT_ITEMS), DEQUANT_THREADS) * DEQUANT_THREADS, DEQUANT_THREADS


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes as flat uint8, whatever dtype stores them (no copy when contiguous)."""
    return t.contiguous().reshape(-1).view(torch.uint8)
