"""LLM.int8() on the cpu: row/column-wise int8 quantization, the exact int8 GEMM and its dequantization."""

from __future__ import annotations

from math import prod

import torch

from bitsandbytes._ops import (
    check_int8_double_quant,
    check_int8_mixed_scaled_mm,
    check_int8_mm_dequant,
    check_int8_scaled_mm,
    check_int8_vectorwise_dequant,
    check_int8_vectorwise_quant,
)
from bitsandbytes.backends import kit

from ._capsules import native as _C
from ._features import amx_tiles, onednn_enabled
from ._threads import threads

# Rows of A from which the int8 GEMM is torch._int_mm (oneDNN, on AMX-INT8 tiles) where the CPU has AMX; fewer
# rows, or no AMX, run our AVX512-VNNI / AVX2 kernel. Both are exact (int32 sums), so the route changes no
# bit. Measured on an AMX Xeon, 2 threads, [M, 4096] x [4096, 4096], medians in ms, ours / torch._int_mm:
# 1 row 0.33 / 0.69, 8 rows 0.52 / 0.67, 17 rows 0.92 / 0.74, 32 rows 1.56 / 0.83, 512 rows 21.7 / 5.6
# (and 61 / 16 at [512, 4096] x [4096, 11008]). torch >= 2.6: older CPU _int_mm could overflow (pytorch#136942).
INT_MM_MIN_ROWS = 16
# Whether the route above is taken; None: by CPU feature (AMX) and torch version. Tests set it.
INT_MM: bool | None = None
_TORCH_INT_MM_EXACT = torch.__version__ >= (2, 6)  # parsed once: a version comparison costs microseconds


def _int_mm_route(M: int, N: int, K: int) -> bool:
    if M < INT_MM_MIN_ROWS or N == 0 or K == 0:
        return False
    if INT_MM is not None:
        return INT_MM
    return _TORCH_INT_MM_EXACT and amx_tiles() and onednn_enabled()  # off: _int_mm is ~100x slower


def _int_mm_into(A: torch.Tensor, B: torch.Tensor, out: torch.Tensor) -> None:
    """out (int32, contiguous) = A @ B.T by torch._int_mm; A, B contiguous."""
    M, K = _rows(A), A.shape[-1]
    torch._int_mm(A.reshape(M, K), B.t(), out=out.view(M, B.shape[0]))


def _rows(A: torch.Tensor) -> int:
    return prod(A.shape[:-1])


def _compare_threshold(A: torch.Tensor, threshold: float) -> float:
    """The threshold as the reference's ``A.abs() >= threshold`` sees it: rounded to A's dtype."""
    return torch.tensor(threshold, dtype=A.dtype).item()


def _contig(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.contiguous()


def _vectorwise_quant(A: torch.Tensor, threshold: float):
    A = A.contiguous()
    codes = torch.empty(A.shape, dtype=torch.int8)
    stats = torch.empty(_rows(A), dtype=torch.float32)
    if threshold > 0.0:
        buf = torch.empty(A.shape[-1], dtype=torch.int64)
        n = _C.int8_vectorwise_quant(A, _compare_threshold(A, threshold), codes, stats, buf, threads())
        return codes, stats, buf[:n].clone()
    _C.int8_vectorwise_quant(A, 0.0, codes, stats, None, threads())
    return codes, stats, None


def int8_vectorwise_quant(A: torch.Tensor, threshold: float = 0.0):
    check_int8_vectorwise_quant(A, threshold)
    return _vectorwise_quant(A, threshold)


def int8_vectorwise_dequant(A: torch.Tensor, stats: torch.Tensor) -> torch.Tensor:
    check_int8_vectorwise_dequant(A, stats)
    out = torch.empty(A.shape, dtype=torch.float32)
    _C.int8_vectorwise_dequant(A.contiguous(), stats.contiguous(), out, threads())
    return out


def _linear_matmul_into(A: torch.Tensor, B: torch.Tensor, out: torch.Tensor) -> None:
    A, B = A.contiguous(), B.contiguous()
    if _int_mm_route(_rows(A), B.shape[0], A.shape[-1]):
        _int_mm_into(A, B, out)
    else:
        _C.int8_linear_matmul(A, B, out, threads())


_LINEAR_MATMUL = kit.out_pair("int8_linear_matmul", _linear_matmul_into)
int8_linear_matmul, int8_linear_matmul_out = _LINEAR_MATMUL.values()


def int8_mm_dequant(A, row_stats, col_stats, dtype=None, bias=None) -> torch.Tensor:
    out_dtype = check_int8_mm_dequant(A, row_stats, col_stats, dtype, bias)
    out = torch.empty(A.shape, dtype=out_dtype)
    _C.int8_mm_dequant(A.contiguous(), row_stats.contiguous(), col_stats.contiguous(), _contig(bias), out, threads())
    return out


def _scaled_mm(A, B, row_stats, col_stats, bias, shape, out_dtype) -> torch.Tensor:
    out = torch.empty(shape, dtype=out_dtype)
    A, B, row_stats, col_stats = A.contiguous(), B.contiguous(), row_stats.contiguous(), col_stats.contiguous()
    if _int_mm_route(_rows(A), B.shape[0], A.shape[-1]):
        # The fused kernel's epilogue (mm_dequant_value) on torch's exact int32 sums: the same bits.
        acc = torch.empty(shape, dtype=torch.int32)
        _int_mm_into(A, B, acc)
        _C.int8_mm_dequant(acc, row_stats, col_stats, _contig(bias), out, threads())
    else:
        _C.int8_scaled_mm(A, B, row_stats, col_stats, _contig(bias), out, threads())
    return out


def int8_scaled_mm(A, B, row_stats, col_stats, bias=None, dtype=None) -> torch.Tensor:
    shape, out_dtype = check_int8_scaled_mm(A, B, row_stats, col_stats, bias, dtype)
    return _scaled_mm(A, B, row_stats, col_stats, bias, shape, out_dtype)


def int8_mixed_scaled_mm(A, CA, CB, SCA, SCB, outlier_cols=None, bias=None):
    shape = check_int8_mixed_scaled_mm(A, CA, CB, SCA, SCB, outlier_cols, bias)
    cols = outlier_cols if outlier_cols is not None else torch.zeros(0, dtype=torch.int64)
    subA = A[..., cols]
    if cols.numel() == 0:
        # No outliers: the fused kernel rounds the fp32 result to A's dtype once, as the reference does.
        return _scaled_mm(CA, CB, SCA, SCB, bias, shape, A.dtype), subA
    # int8 part (dequantized, bias added) in fp32, plus the outlier columns' fp32 product, rounded once.
    out = _scaled_mm(CA, CB, SCA, SCB, bias, shape, torch.float32)
    subB = int8_vectorwise_dequant(CB[:, cols], SCB)
    out.view(-1, shape[-1]).addmm_(subA.reshape(-1, cols.numel()).float(), subB.T)
    return out.to(A.dtype), subA


def int8_double_quant(A: torch.Tensor, threshold: float = 0.0):
    check_int8_double_quant(A, threshold)
    A = A.contiguous()
    row_codes, row_stats, outlier_cols = _vectorwise_quant(A, threshold)
    col_codes = torch.empty(A.shape, dtype=torch.int8)
    col_stats = torch.empty(A.shape[-1], dtype=torch.float32)
    outliers = threshold > 0.0
    thr = _compare_threshold(A, threshold) if outliers else 0.0
    _C.int8_colwise_quant(A, outliers, thr, col_codes, col_stats, threads())
    return row_codes, col_codes, row_stats, col_stats, outlier_cols


OPS = {
    "int8_vectorwise_quant": int8_vectorwise_quant,
    "int8_vectorwise_dequant": int8_vectorwise_dequant,
    **_LINEAR_MATMUL,
    "int8_mm_dequant": int8_mm_dequant,
    "int8_scaled_mm": int8_scaled_mm,
    "int8_mixed_scaled_mm": int8_mixed_scaled_mm,
    "int8_double_quant": int8_double_quant,
}
