"""quantize/dequantize_blockwise (8-bit) on CUDA, and the launch geometry of every blockwise quantizer.

Validation is the core's (same errors as the reference); outputs are allocated by torch on the input's
device; the launch geometry of the 8-bit and the 4-bit (ops/fourbit.py) kernels is computed here and
nowhere else (the kernels' requirements are stated at the top of csrc/kernels/blockwise.cu).
"""

from __future__ import annotations

import torch

from bitsandbytes import _checks
from bitsandbytes._ops import check_quantize_blockwise
from bitsandbytes._reference import REFERENCE
from bitsandbytes.backends import kit

from ..launch import launch
from ._common import suffix

# Values per thread in the blockwise and fourbit kernels (kItems in block_quant.cuh).
ITEMS_PER_THREAD = 8
# Threads per block of the dequantizers, and the least per block of the quantizers.
THREADS = 256
# Largest grid: the kernels stride over the rest, so each block loads its code table once for many
# values. Enough blocks to fill any current GPU several times over (tests lower it to exercise the stride).
MAX_GRID = 4096


def quantize_geometry(n: int, blocksize: int) -> tuple[int, int]:
    """(grid, threads) of a quantizer: a group of blocksize / 8 threads per quantization block."""
    group = blocksize // ITEMS_PER_THREAD
    threads = max(THREADS, group)
    per_block = threads // group
    blocks = _checks.n_blocks(n, blocksize)
    return max(1, min(MAX_GRID, _checks.n_blocks(blocks, per_block))), threads


def dequantize_geometry(n: int) -> tuple[int, int]:
    """(grid, threads) of a dequantizer: 8 consecutive values per thread."""
    return max(1, min(MAX_GRID, _checks.n_blocks(n, THREADS * ITEMS_PER_THREAD))), THREADS


def absmax_for(A: torch.Tensor, blocksize: int) -> torch.Tensor:
    """The float32 absmax a quantizer of A writes, one per block (the last one short), on A's device."""
    return torch.empty(_checks.n_blocks(A.numel(), blocksize), dtype=torch.float32, device=A.device)


def sorted_code_map(code: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 8-bit map's float32 midpoints in value order (256; the last unused) and each sorted slot's code."""
    mids = torch.empty(256, dtype=torch.float32, device=code.device)
    order = torch.empty(256, dtype=torch.uint8, device=code.device)
    launch("quant_map_prepare", 1, 256, 0, code.contiguous(), mids, order)
    return mids, order


def quantize_blockwise(A: torch.Tensor, code: torch.Tensor, blocksize: int) -> tuple[torch.Tensor, torch.Tensor]:
    check_quantize_blockwise(A, code, blocksize)
    if blocksize not in _checks.BLOCKSIZES:  # the launch geometry covers powers of two in [32, 4096] only
        return REFERENCE["quantize_blockwise"](A, code, blocksize)
    n = A.numel()
    out, absmax = torch.empty(A.shape, dtype=torch.uint8, device=A.device), absmax_for(A, blocksize)
    if n:
        mids, order = sorted_code_map(code)
        grid, threads = quantize_geometry(n, blocksize)
        name = f"quantize_blockwise_{suffix(A.dtype)}"
        launch(name, grid, threads, 0, A.contiguous(), mids, order, out, absmax, n, blocksize)
    return out, absmax


def _dequantize_blockwise_into(A, absmax, code, blocksize, dtype, out) -> None:
    n = A.numel()
    if n:
        grid, threads = dequantize_geometry(n)
        name = f"dequantize_blockwise_{suffix(out.dtype)}"
        launch(name, grid, threads, 0, A.contiguous(), absmax.contiguous(), code.contiguous(), out, n, blocksize)


# The functional op and its .out: the core's checks, then the kernel (the reference for a block size the
# launch geometry does not cover: powers of two in [32, 4096] only).
_DEQUANTIZE = kit.out_pair(
    "dequantize_blockwise",
    _dequantize_blockwise_into,
    native=lambda A, absmax, code, blocksize, dtype: blocksize in _checks.BLOCKSIZES,
)
dequantize_blockwise = _DEQUANTIZE["dequantize_blockwise"]
dequantize_blockwise_out = _DEQUANTIZE["dequantize_blockwise.out"]

# op name -> implementation (registered by bitsandbytes_cuda.ops.register_all).
OPS = {"quantize_blockwise": quantize_blockwise, **_DEQUANTIZE}
