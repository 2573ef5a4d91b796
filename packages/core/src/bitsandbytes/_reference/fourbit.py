"""Reference kernels for 4-bit (NF4 / FP4) quantization and the matmuls on the packed format.

Semantics (the contract every backend is checked against; layout in ``bitsandbytes._formats``):

* Blocks and scaling exactly as the 8-bit blockwise reference (``block_absmax_and_scale``): float32
  absmax per block of the flattened input, values scaled into [-1, 1].
* Each scaled value gets the 4-bit code of the nearest entry of the 16-entry table, by the same rule
  as 8-bit: midpoints between neighbours of the table sorted by value (stably), a value on a
  midpoint goes to the smaller neighbour. NF4 is sorted, so ties go to the lower code. FP4 is in code
  order, so ties go to the more negative value; its two zeros (codes 0 and 8, both +0.0 in the table)
  split at 0: s in (-0.0026, 0] gets code 0 and s in (0, 0.0026] gets code 8. This is bit for bit what
  upstream 0.50 produces on CPU (its default kernel).
* Codes are packed two per byte, the first in the high nibble. For an odd count the missing last
  value is quantized as 0.0, so the final low nibble is the code of 0.0 (NF4: 7, FP4: 0), as upstream.
* The bytes are returned as ``quant_storage`` with shape ``((n + 1) // (2 * itemsize), 1)``.
* Dequantization is ``table[code] * absmax[block]`` in float32, cast to ``dtype``, shaped ``shape``.
* ``gemv_4bit`` / ``gemm_4bit`` compute ``A @ W.T`` where ``W`` is the dequantized weight in
  ``A.dtype`` (what ``dequantize_4bit`` returns); the product is accumulated in float32 (plus bias,
  for gemm) and cast to ``A.dtype`` once. Backends may sum in another order: the conformance suite
  compares them with a tolerance.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

import torch

from .. import _checks, _formats
from .._ops import check_dequantize_4bit, check_gemm_4bit, check_gemv_4bit, check_quantize_4bit
from ._registry import reference
from .blockwise import block_absmax_and_scale, dequantize_blockwise, expand_per_block, nearest_code


def _pack(codes: torch.Tensor) -> torch.Tensor:
    """Two 4-bit codes per byte, first in the high nibble; ``codes`` has even length."""
    pairs = codes.to(torch.uint8).reshape(-1, 2)
    return (pairs[:, 0] << 4) | pairs[:, 1]


def _unpack(A: torch.Tensor, n: int) -> torch.Tensor:
    """The first ``n`` 4-bit codes (int64) held by the bytes of ``A`` (any storage dtype)."""
    raw = A.contiguous().reshape(-1).view(torch.uint8)
    codes = torch.stack([raw >> 4, raw & 0x0F], dim=1).reshape(-1)
    return codes[:n].long()


def _dequantize(
    A: torch.Tensor, absmax: torch.Tensor, table: torch.Tensor, blocksize: int, shape: Sequence[int]
) -> torch.Tensor:
    """The float32 values of a packed 4-bit tensor, with shape ``shape``."""
    n = prod(shape)
    values = table.reshape(-1)[_unpack(A, n)] * expand_per_block(absmax, n, blocksize)
    return values.reshape(shape)


@reference("quantize_4bit")
def quantize_4bit(
    A: torch.Tensor, blocksize: int, quant_type: str, quant_storage: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    check_quantize_4bit(A, blocksize, quant_type, quant_storage)
    absmax, scaled = block_absmax_and_scale(A, blocksize)
    if scaled.numel() % 2:
        scaled = torch.cat([scaled, scaled.new_full((1,), _formats.PAD_VALUE)])
    codes = nearest_code(scaled, _formats.code_table(quant_type, A.device))
    packed = _pack(codes)
    out = packed.view(quant_storage).reshape(_formats.packed_4bit_shape(A.numel(), quant_storage))
    return out, absmax


@reference("dequantize_4bit")
def dequantize_4bit(
    A: torch.Tensor, absmax: torch.Tensor, blocksize: int, quant_type: str, shape: Sequence[int], dtype: torch.dtype
) -> torch.Tensor:
    dims = check_dequantize_4bit(A, absmax, blocksize, quant_type, shape, dtype)
    table = _formats.code_table(quant_type, A.device)
    return _dequantize(A, absmax, table, blocksize, dims).to(dtype)


@reference("dequantize_4bit.out")
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
    table = _formats.code_table(quant_type, A.device)
    out.copy_(_dequantize(A, absmax, table, blocksize, dims))


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
    return _linear(A, _dequantize(B, absmax, code, blocksize, (N, K)))


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
    out.copy_(_linear(A, _dequantize(B, absmax, code, blocksize, (N, K))))


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
    return _linear(A, _dequantize(B, absmax, table, blocksize, (N, K)), bias)
