"""LLM.int8() functions of ``bitsandbytes.functional``, with upstream 0.50's signatures and defaults.

Each one checks the arguments that only it has (the ``out``/pre-allocation keywords, ``dtype``) and
calls ``torch.ops.bitsandbytes.*``; the op checks the rest and raises the same errors on every device.
"""

from __future__ import annotations

import torch

from .. import _checks as c

__all__ = [
    "int8_double_quant",
    "int8_linear_matmul",
    "int8_mm_dequant",
    "int8_vectorwise_dequant",
    "int8_vectorwise_quant",
]


def int8_vectorwise_quant(A: torch.Tensor, threshold=0.0):
    """Quantize each row of ``A`` (``[..., K]``, fp16/bf16/fp32) to int8 with its absolute maximum as scale.

    Codes are ``round(a * 127 / absmax)`` (half to even). With ``threshold > 0``, values with
    ``|a| >= threshold`` are outliers: they are left out of the row scales, and every column holding
    one gets code 0 in all rows (the caller handles those columns in floating point).
    A non-contiguous ``A`` is read as is; the codes are always contiguous.

    Returns:
        ``(codes, row_stats, outlier_cols)``: int8 codes shaped like ``A``; float32 scales, one per
        row; and the sorted int64 indices of the outlier columns (``None`` when ``threshold == 0``).
    """
    c.tensor("A", A)
    return torch.ops.bitsandbytes.int8_vectorwise_quant.default(A, threshold)


def int8_vectorwise_dequant(A: torch.Tensor, stats: torch.Tensor):
    """Dequantize int8 row codes to float32: ``A * stats[row] / 127`` (as ``A * stats * (1/127)``)."""
    c.tensor("A", A)
    c.tensor("stats", stats)
    return torch.ops.bitsandbytes.int8_vectorwise_dequant.default(A, stats)


def int8_linear_matmul(A: torch.Tensor, B: torch.Tensor, out: torch.Tensor | None = None, dtype=torch.int32):
    """Exact int8 matrix product ``A @ B.T`` as int32: ``A`` is ``[..., K]``, ``B`` is ``[N, K]``.

    Args:
        out: optional contiguous int32 tensor of shape ``[..., N]`` to write the result into.
        dtype: must be ``torch.int32``, the only result type (kept for upstream's signature).
    """
    c.tensor("A", A)
    c.tensor("B", B)
    if dtype != torch.int32:
        raise TypeError(f"dtype must be torch.int32 (the only result type of int8_linear_matmul); got {dtype!r}")
    if out is not None:
        torch.ops.bitsandbytes.int8_linear_matmul.out(A, B, c.tensor("out", out))
        return out
    return torch.ops.bitsandbytes.int8_linear_matmul.default(A, B)


def int8_mm_dequant(
    A: torch.Tensor,
    row_stats: torch.Tensor,
    col_stats: torch.Tensor,
    out: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
):
    """Dequantize the int32 result of an int8 matmul to float16, adding ``bias`` if given.

    ``result = A * row_stats[row] * col_stats[col] / 127**2 + bias`` (computed in float32). When
    ``out`` is given (shape of ``A``, any floating dtype, same device) the result is copied into it
    and ``out`` is returned.
    """
    c.tensor("A", A)
    if out is not None:
        c.dtype("out", out, c.FLOAT_DTYPES)
        if tuple(out.shape) != tuple(A.shape):
            raise ValueError(f"out must have the shape of A {tuple(A.shape)}; got {tuple(out.shape)}")
        c.same_device("A", A, out=out)
    result = torch.ops.bitsandbytes.int8_mm_dequant.default(A, row_stats, col_stats, dtype=torch.float16, bias=bias)
    if out is not None:
        return out.copy_(result)
    return result


def int8_double_quant(
    A: torch.Tensor,
    col_stats: torch.Tensor | None = None,
    row_stats: torch.Tensor | None = None,
    out_col: torch.Tensor | None = None,
    out_row: torch.Tensor | None = None,
    threshold=0.0,
):
    """Quantize ``A`` both row-wise (as ``int8_vectorwise_quant``) and column-wise.

    The pre-allocated outputs of older releases are not supported (as upstream 0.50): passing any of
    ``col_stats``, ``row_stats``, ``out_col``, ``out_row`` raises ``ValueError``.

    Returns:
        ``(row_codes, col_codes, row_stats, col_stats, outlier_cols)``; ``outlier_cols`` is ``None``
        when ``threshold == 0``.
    """
    for name, value in (("row_stats", row_stats), ("col_stats", col_stats), ("out_col", out_col), ("out_row", out_row)):
        if value is not None:
            raise ValueError(f"{name} must be None: int8_double_quant() allocates its outputs itself")
    c.tensor("A", A)
    return torch.ops.bitsandbytes.int8_double_quant.default(A, threshold=threshold)
