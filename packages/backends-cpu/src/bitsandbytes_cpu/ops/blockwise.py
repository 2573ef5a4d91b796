"""8-bit blockwise quantize / dequantize on the cpu."""

from __future__ import annotations

import torch

from bitsandbytes import _checks
from bitsandbytes._ops import check_dequantize_blockwise, check_quantize_blockwise
from bitsandbytes._reference import REFERENCE

from .. import _C
from . import _outputs
from ._register import cpu_kernel, threads


def quantize_blockwise(A: torch.Tensor, code: torch.Tensor, blocksize: int) -> tuple[torch.Tensor, torch.Tensor]:
    check_quantize_blockwise(A, code, blocksize)
    if blocksize not in _checks.BLOCKSIZES:  # the kernels take powers of two in [32, 4096] only
        return REFERENCE["quantize_blockwise"](A, code, blocksize)
    out = torch.empty(A.shape, dtype=torch.uint8)
    absmax = torch.empty(_checks.n_blocks(A.numel(), blocksize), dtype=torch.float32)
    if A.numel():
        _C.quantize_blockwise(A.contiguous(), code.contiguous(), blocksize, out, absmax, threads())
    return out, absmax


def _dequantize_into(A, absmax, code, blocksize, out) -> None:
    if A.numel():
        _C.dequantize_blockwise(A.contiguous(), absmax.contiguous(), code.contiguous(), blocksize, out, threads())


def dequantize_blockwise(A, absmax, code, blocksize, dtype) -> torch.Tensor:
    check_dequantize_blockwise(A, absmax, code, blocksize, dtype)
    if blocksize not in _checks.BLOCKSIZES:
        return REFERENCE["dequantize_blockwise"](A, absmax, code, blocksize, dtype)
    out = _outputs.empty(A.shape, dtype)
    _dequantize_into(A, absmax, code, blocksize, out)
    return out


def dequantize_blockwise_out(A, absmax, code, blocksize, dtype, out) -> None:
    check_dequantize_blockwise(A, absmax, code, blocksize, dtype)
    _checks.out_tensor(out, A.shape, dtype, A.device, reads={"A": A, "absmax": absmax, "code": code})
    if blocksize not in _checks.BLOCKSIZES:
        return REFERENCE["dequantize_blockwise.out"](A, absmax, code, blocksize, dtype, out)
    _dequantize_into(A, absmax, code, blocksize, out)


def register() -> None:
    cpu_kernel("quantize_blockwise", quantize_blockwise)
    cpu_kernel("dequantize_blockwise", dequantize_blockwise)
    cpu_kernel("dequantize_blockwise.out", dequantize_blockwise_out)
