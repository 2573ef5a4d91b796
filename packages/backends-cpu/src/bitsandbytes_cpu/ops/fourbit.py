"""4-bit (nf4 / fp4) quantize / dequantize on the cpu."""

from __future__ import annotations

import torch

from bitsandbytes import _checks, _formats
from bitsandbytes._ops import check_quantize_4bit
from bitsandbytes.backends import kit

from . import _outputs
from ._capsules import native as _C
from ._threads import threads


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


def _dequantize_into(A, absmax, blocksize, quant_type, shape, dtype, out: torch.Tensor) -> None:
    if out.numel():
        _C.dequantize_4bit(_bytes(A), absmax.contiguous(), quant_type, blocksize, out, threads())


# dequantize_4bit and its .out overload; the fresh result reuses a dropped one's memory (_outputs).
_DEQUANTIZE = kit.out_pair("dequantize_4bit", _dequantize_into, empty=_outputs.empty)
dequantize_4bit, dequantize_4bit_out = _DEQUANTIZE.values()

OPS = {"quantize_4bit": quantize_4bit, **_DEQUANTIZE}
