"""Reference kernels for the matmuls on the packed 4-bit format (``gemv_4bit``, ``gemm_4bit``).

Semantics: ``A @ W.T`` where ``W`` is the dequantized weight in ``A.dtype`` (what ``dequantize_4bit``
returns, see ``fourbit``); the product is accumulated in float32 (plus bias, for gemm) and cast to
``A.dtype`` once. Backends may sum in another order: the conformance suite compares them with a
tolerance.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .. import _checks, _formats
from .._ops import check_gemm_4bit, check_gemv_4bit
from ._registry import reference
from .blockwise import dequantize_blockwise
from .fourbit import dequantize_float32


def _linear(A: torch.Tensor, W: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``A @ W.T (+ bias)`` with W first rounded to A's dtype, accumulated in float32, cast once."""
    result = A.float() @ W.to(A.dtype).float().T
    if bias is not None:
        result = result + bias.float()
    return result.to(A.dtype)


@reference("gemv_4bit")
def gemv_4bit(
    A: torch.Tensor, B: torch.Tensor, shapeB: Sequence[int], absmax: torch.Tensor, code: torch.Tensor, blocksize: int
) -> torch.Tensor:
    N, K = check_gemv_4bit(A, B, shapeB, absmax, code, blocksize)
    return _linear(A, dequantize_float32(B, absmax, code, blocksize, (N, K)))


@reference("gemv_4bit.out")
def gemv_4bit_out(
    A: torch.Tensor,
    B: torch.Tensor,
    shapeB: Sequence[int],
    absmax: torch.Tensor,
    code: torch.Tensor,
    blocksize: int,
    out: torch.Tensor,
) -> None:
    N, K = check_gemv_4bit(A, B, shapeB, absmax, code, blocksize)
    _checks.out_tensor(
        out, (*A.shape[:-1], N), A.dtype, A.device, reads={"A": A, "B": B, "absmax": absmax, "code": code}
    )
    out.copy_(_linear(A, dequantize_float32(B, absmax, code, blocksize, (N, K))))


@reference("gemm_4bit")
def gemm_4bit(
    A: torch.Tensor,
    B: torch.Tensor,
    shapeB: Sequence[int],
    absmax: torch.Tensor,
    blocksize: int,
    quant_type: str,
    bias: torch.Tensor | None = None,
    absmax_8bit: torch.Tensor | None = None,
    absmax_code: torch.Tensor | None = None,
    absmax_offset: torch.Tensor | None = None,
) -> torch.Tensor:
    N, K = check_gemm_4bit(A, B, shapeB, absmax, blocksize, quant_type, bias, absmax_8bit, absmax_code, absmax_offset)
    if absmax_8bit is not None:
        # Double quantization: absmax holds the scales of the 8-bit-coded block scales, one per
        # DOUBLE_QUANT_BLOCKSIZE of them, and absmax_offset the mean subtracted before coding.
        nested = dequantize_blockwise(absmax_8bit, absmax, absmax_code, _formats.DOUBLE_QUANT_BLOCKSIZE, torch.float32)
        absmax = nested + absmax_offset.reshape(()).float()
    table = _formats.code_table(quant_type, A.device)
    return _linear(A, dequantize_float32(B, absmax, table, blocksize, (N, K)), bias)
