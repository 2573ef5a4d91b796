"""Reference kernels for 4-bit (NF4 / FP4) quantization and dequantization (the matmuls on the packed
format are in ``matmul_4bit``).

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
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

import torch

from .. import _checks, _formats
from .._ops import check_dequantize_4bit, check_quantize_4bit
from ._registry import reference
from .blockwise import block_absmax_and_scale, expand_per_block, nearest_code


def _pack(codes: torch.Tensor) -> torch.Tensor:
    """Two 4-bit codes per byte, first in the high nibble; ``codes`` has even length."""
    pairs = codes.to(torch.uint8).reshape(-1, 2)
    return (pairs[:, 0] << 4) | pairs[:, 1]


def _unpack(A: torch.Tensor, n: int) -> torch.Tensor:
    """The first ``n`` 4-bit codes (int64) held by the bytes of ``A`` (any storage dtype)."""
    raw = A.contiguous().reshape(-1).view(torch.uint8)
    codes = torch.stack([raw >> 4, raw & 0x0F], dim=1).reshape(-1)
    return codes[:n].long()


def dequantize_float32(
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
    return dequantize_float32(A, absmax, table, blocksize, dims).to(dtype)


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
    out.copy_(dequantize_float32(A, absmax, table, blocksize, dims))
