"""quantize/dequantize_4bit (NF4/FP4) on CUDA.

Validation is the core's (same errors as the reference); the launch geometry is the blockwise family's
(ops/blockwise.py), whose block machinery the 4-bit kernels share.
"""

from __future__ import annotations

import torch

from bitsandbytes import _checks, _formats
from bitsandbytes._ops import check_quantize_4bit
from bitsandbytes.backends import kit

from ..launch import launch
from ._common import suffix
from .blockwise import absmax_for, dequantize_geometry, quantize_geometry


def quantize_4bit(
    A: torch.Tensor, blocksize: int, quant_type: str, quant_storage: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    check_quantize_4bit(A, blocksize, quant_type, quant_storage)
    n = A.numel()
    # The kernel writes bytes; quant_storage is only a view of them.
    packed = torch.empty(_checks.packed_4bit_bytes(n), dtype=torch.uint8, device=A.device)
    absmax = absmax_for(A, blocksize)
    if n:
        grid, threads = quantize_geometry(n, blocksize)
        name = f"quantize_4bit_{quant_type}_{suffix(A.dtype)}"
        launch(name, grid, threads, 0, A.contiguous(), packed, absmax, n, blocksize)
    return packed.view(quant_storage).reshape(_formats.packed_4bit_shape(n, quant_storage)), absmax


def _dequantize_4bit_into(A, absmax, blocksize, quant_type, shape, dtype, out) -> None:
    n = out.numel()
    if n:
        grid, threads = dequantize_geometry(n)
        name = f"dequantize_4bit_{quant_type}_{suffix(out.dtype)}"
        raw = A.contiguous().reshape(-1).view(torch.uint8)  # the bytes, whatever the storage dtype
        launch(name, grid, threads, 0, raw, absmax.contiguous(), out, n, blocksize)


# The functional op and its .out: the core's checks, then the kernel.
_DEQUANTIZE = kit.out_pair("dequantize_4bit", _dequantize_4bit_into)
dequantize_4bit = _DEQUANTIZE["dequantize_4bit"]
dequantize_4bit_out = _DEQUANTIZE["dequantize_4bit.out"]

# op name -> implementation (registered by bitsandbytes_cuda.ops.register_all).
OPS = {"quantize_4bit": quantize_4bit, **_DEQUANTIZE}
