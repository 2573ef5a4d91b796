"""4-bit (nf4 / fp4) quantize / dequantize on the cpu."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from bitsandbytes import _checks, _formats
from bitsandbytes._ops import check_dequantize_4bit, check_quantize_4bit

from .. import _C
from . import _outputs
from ._register import cpu_kernel, threads


def quantize_4bit(
    A: torch.Tensor, blocksize: int, quant_type: str, quant_storage: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    check_quantize_4bit(A, blocksize, quant_type, quant_storage)
    n = A.numel()
    # The kernel writes bytes; quant_storage is only a view of them (same bytes for every dtype).
    packed = torch.empty(_checks.packed_4bit_bytes(n), dtype=torch.uint8)
    absmax = torch.empty(_checks.n_blocks(n, blocksize), dtype=torch.float32)
    if n:
        _C.quantize_4bit(A.contiguous(), quant_type, blocksize, packed, absmax, threads())
    return packed.view(quant_storage).reshape(_formats.packed_4bit_shape(n, quant_storage)), absmax


def _bytes(A: torch.Tensor) -> torch.Tensor:
    """The bytes of A (any quant_storage dtype) as a flat uint8 tensor."""
    return A.contiguous().reshape(-1).view(torch.uint8)


def _dequantize_into(A, absmax, blocksize, quant_type, out) -> None:
    if out.numel():
        _C.dequantize_4bit(_bytes(A), absmax.contiguous(), quant_type, blocksize, out, threads())


def dequantize_4bit(
    A: torch.Tensor, absmax: torch.Tensor, blocksize: int, quant_type: str, shape: Sequence[int], dtype: torch.dtype
) -> torch.Tensor:
    dims = check_dequantize_4bit(A, absmax, blocksize, quant_type, shape, dtype)
    out = _outputs.empty(dims, dtype)
    _dequantize_into(A, absmax, blocksize, quant_type, out)
    return out


def dequantize_4bit_out(
    A: torch.Tensor,
    absmax: torch.Tensor,
    blocksize: int,
    quant_type: str,
    shape: Sequence[int],
    dtype: torch.dtype,
    out: torch.Tensor,
) -> None:
    dims = check_dequantize_4bit(A, absmax, blocksize, quant_type, shape, dtype)
    _checks.out_tensor(out, dims, dtype, A.device, reads={"A": A, "absmax": absmax})
    _dequantize_into(A, absmax, blocksize, quant_type, out)


def register() -> None:
    cpu_kernel("quantize_4bit", quantize_4bit)
    cpu_kernel("dequantize_4bit", dequantize_4bit)
    cpu_kernel("dequantize_4bit.out", dequantize_4bit_out)
