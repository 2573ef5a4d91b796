"""8-bit blockwise quantize / dequantize on the cpu."""

from __future__ import annotations

import torch

from bitsandbytes import _checks
from bitsandbytes._ops import check_quantize_blockwise
from bitsandbytes._reference import REFERENCE
from bitsandbytes.backends import kit

from . import _outputs
from ._capsules import native as _C
from ._maps import holds_nan
from ._threads import threads


def quantize_blockwise(A: torch.Tensor, code: torch.Tensor, blocksize: int) -> tuple[torch.Tensor, torch.Tensor]:
    check_quantize_blockwise(A, code, blocksize)
    # The kernels take powers of two in [32, 4096] only, and maps without NaN (see _maps).
    if blocksize not in _checks.BLOCKSIZES or holds_nan(code):
        return REFERENCE["quantize_blockwise"](A, code, blocksize)
    out = torch.empty(A.shape, dtype=torch.uint8)
    absmax = torch.empty(_checks.n_blocks(A.numel(), blocksize), dtype=torch.float32)
    if A.numel():
        _C.quantize_blockwise(A.contiguous(), code.contiguous(), blocksize, out, absmax, threads())
    return out, absmax


def _dequantize_into(A, absmax, code, blocksize, dtype, out) -> None:
    if A.numel():
        _C.dequantize_blockwise(A.contiguous(), absmax.contiguous(), code.contiguous(), blocksize, out, threads())


def _native(A, absmax, code, blocksize, dtype) -> bool:
    return blocksize in _checks.BLOCKSIZES


_DEQUANTIZE = kit.out_pair("dequantize_blockwise", _dequantize_into, empty=_outputs.empty, native=_native)
dequantize_blockwise, dequantize_blockwise_out = _DEQUANTIZE.values()

OPS = {"quantize_blockwise": quantize_blockwise, **_DEQUANTIZE}
