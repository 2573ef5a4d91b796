"""LLM.int8() for device cuda: the int8 quantizations and dequantizations as kernels (csrc/kernels/int8.cu),
the int8 GEMM through ``torch._int_mm`` (cuBLASLt inside torch), the scaled products composed from both."""

from __future__ import annotations

from math import prod

import torch

from bitsandbytes import _checks, _ops
from bitsandbytes._reference.int8 import _int8_matmul as _reference_int8_matmul

from ..launch import launch
from ..tables.int8 import COL_ROWS, ROW_THREADS
from ._common import rows_cols_geometry, suffix


def _rows_cols(A: torch.Tensor) -> tuple[int, int]:
    return prod(A.shape[:-1]), A.shape[-1]


def _threshold_in(A: torch.Tensor, threshold: float) -> float:
    """The threshold as the reference's ``A.abs() >= threshold`` sees it: rounded to A's dtype."""
    return torch.tensor(threshold, dtype=A.dtype).item()


def _outlier_flags(A: torch.Tensor, thr: float) -> torch.Tensor:
    rows, cols = _rows_cols(A)
    flags = torch.zeros(cols, dtype=torch.uint8, device=A.device)
    if A.numel():
        grid, block = rows_cols_geometry(rows, cols)
        launch(f"int8_outlier_cols_{suffix(A.dtype)}", grid, block, 0, A, thr, flags, rows, cols)
    return flags


def _row_quant(A: torch.Tensor, threshold: float):
    """Codes, row stats and outlier columns of a contiguous A (the body of int8_vectorwise_quant)."""
    rows, cols = _rows_cols(A)
    codes = torch.empty(A.shape, dtype=torch.int8, device=A.device)
    stats = torch.empty(rows, dtype=torch.float32, device=A.device)
    flags, thr = None, 0.0
    if threshold > 0.0:
        thr = _threshold_in(A, threshold)
        flags = _outlier_flags(A, thr)
    if rows:
        launch(f"int8_row_quant_{suffix(A.dtype)}", rows, ROW_THREADS, 0, A, thr, flags, codes, stats, cols)
    # nonzero synchronizes: the number of outlier columns decides the output's size.
    outlier_cols = None if flags is None else torch.nonzero(flags).view(-1)
    return codes, stats, outlier_cols


def int8_vectorwise_quant(A: torch.Tensor, threshold: float = 0.0):
    _ops.check_int8_vectorwise_quant(A, threshold)
    return _row_quant(A.contiguous(), threshold)


def int8_vectorwise_dequant(A: torch.Tensor, stats: torch.Tensor) -> torch.Tensor:
    _ops.check_int8_vectorwise_dequant(A, stats)
    A = A.contiguous()
    out = torch.empty(A.shape, dtype=torch.float32, device=A.device)
    rows, cols = _rows_cols(A)
    if A.numel():
        grid, block = rows_cols_geometry(rows, cols)
        launch("int8_vectorwise_dequant", grid, block, 0, A, stats.contiguous(), out, rows, cols)
    return out


def int8_double_quant(A: torch.Tensor, threshold: float = 0.0):
    _ops.check_int8_double_quant(A, threshold)
    A = A.contiguous()
    row_codes, row_stats, outlier_cols = _row_quant(A, threshold)
    rows, cols = _rows_cols(A)
    col_codes = torch.empty(A.shape, dtype=torch.int8, device=A.device)
    col_stats = torch.zeros(cols, dtype=torch.float32, device=A.device)  # the kernel merges with atomicMax
    outliers = int(threshold > 0.0)
    thr = _threshold_in(A, threshold) if outliers else 0.0
    sfx = suffix(A.dtype)
    if A.numel():
        # About 16 rows per lane; grid.y is capped, lanes stride the rest.
        row_blocks = min(max(1, rows // (COL_ROWS * 16)), 65535)
        grid = ((cols + 31) // 32, row_blocks)
        launch(f"int8_col_absmax_{sfx}", grid, (32, COL_ROWS), 0, A, thr, outliers, col_stats, rows, cols)
    if A.numel():
        grid, block = rows_cols_geometry(rows, cols)
        launch(f"int8_col_quant_{sfx}", grid, block, 0, A, thr, outliers, col_stats, col_codes, rows, cols)
    return row_codes, col_codes, row_stats, col_stats, outlier_cols


# torch._int_mm on CUDA wants more than 16 rows and K, N positive multiples of 8 (B column-major: B.t()).
_INT_MM_MIN_ROWS = 17


def _int_mm_accepts(K: int, N: int) -> bool:
    return K > 0 and K % 8 == 0 and N > 0 and N % 8 == 0


def _int8_matmul(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    M, K = _rows_cols(A)
    N = B.shape[0]
    if A.is_cuda and M > 0 and _int_mm_accepts(K, N):
        A2 = A.reshape(M, K)
        if M < _INT_MM_MIN_ROWS:  # decoding: zero rows pad A up to _int_mm's minimum; int32 sums stay exact
            A2 = torch.nn.functional.pad(A2, (0, 0, 0, _INT_MM_MIN_ROWS - M))
        return torch._int_mm(A2, B.t())[:M].reshape(*A.shape[:-1], N)
    # Shapes cuBLASLt rejects (and emulation, on the CPU): the reference's exact chunked fp32 product.
    return _reference_int8_matmul(A, B)


def int8_linear_matmul(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    _ops.check_int8_linear_matmul(A, B)
    return _int8_matmul(A.contiguous(), B.contiguous())


def int8_linear_matmul_out(A: torch.Tensor, B: torch.Tensor, out: torch.Tensor) -> None:
    _checks.out_tensor(out, _ops.check_int8_linear_matmul(A, B), torch.int32, A.device, reads={"A": A, "B": B})
    out.copy_(_int8_matmul(A.contiguous(), B.contiguous()))


def _mm_dequant(A, row_stats, col_stats, bias, out_dtype) -> torch.Tensor:
    A = A.contiguous()
    out = torch.empty(A.shape, dtype=out_dtype, device=A.device)
    rows, cols = _rows_cols(A)
    if A.numel():
        b = None if bias is None else bias.contiguous().float()
        grid, block = rows_cols_geometry(rows, cols)
        launch(
            f"int8_mm_dequant_{suffix(out_dtype)}", grid, block, 0,
            A, row_stats.contiguous(), col_stats.contiguous(), b, out, rows, cols,
        )  # fmt: skip
    return out


def int8_mm_dequant(A, row_stats, col_stats, dtype=None, bias=None) -> torch.Tensor:
    out_dtype = _ops.check_int8_mm_dequant(A, row_stats, col_stats, dtype, bias)
    return _mm_dequant(A, row_stats, col_stats, bias, out_dtype)


def int8_scaled_mm(A, B, row_stats, col_stats, bias=None, dtype=None) -> torch.Tensor:
    _, out_dtype = _ops.check_int8_scaled_mm(A, B, row_stats, col_stats, bias, dtype)
    return _mm_dequant(_int8_matmul(A.contiguous(), B.contiguous()), row_stats, col_stats, bias, out_dtype)


def int8_mixed_scaled_mm(A, CA, CB, SCA, SCB, outlier_cols=None, bias=None):
    _ops.check_int8_mixed_scaled_mm(A, CA, CB, SCA, SCB, outlier_cols, bias)
    cols = outlier_cols if outlier_cols is not None else torch.zeros(0, dtype=torch.int64, device=A.device)
    subA = A[..., cols]
    acc = _int8_matmul(CA.contiguous(), CB.contiguous())
    if cols.numel() == 0:
        return _mm_dequant(acc, SCA, SCB, bias, A.dtype), subA
    # The int8 part (bias added) and the outlier columns' product are summed in fp32 and rounded once.
    out = _mm_dequant(acc, SCA, SCB, bias, torch.float32)
    subB = int8_vectorwise_dequant(CB[:, cols], SCB)
    out = out + subA.float() @ subB.T
    return out.to(A.dtype), subA


OPS = {
    "int8_vectorwise_quant": int8_vectorwise_quant,
    "int8_vectorwise_dequant": int8_vectorwise_dequant,
    "int8_double_quant": int8_double_quant,
    "int8_linear_matmul": int8_linear_matmul,
    "int8_linear_matmul.out": int8_linear_matmul_out,
    "int8_mm_dequant": int8_mm_dequant,
    "int8_scaled_mm": int8_scaled_mm,
    "int8_mixed_scaled_mm": int8_mixed_scaled_mm,
}
