"""LLM.int8() for device mps: vectorwise quantization (with outlier columns), its dequantization and
int8_mm_dequant on Metal kernels (metal/int8.metal). The int8 GEMM and the ops built on it
(int8_linear_matmul, int8_scaled_mm, int8_mixed_scaled_mm, int8_double_quant) stay on the core's
reference kernels, which run on the MPS device through torch."""

from __future__ import annotations

from math import prod

import torch

from bitsandbytes import _formats
from bitsandbytes._ops import check_int8_mm_dequant, check_int8_vectorwise_dequant, check_int8_vectorwise_quant
from bitsandbytes._reference import int8 as _reference

from ..library import dispatch
from ._common import GROUP, elementwise, native, placeholder, suffix

SOURCES = ("int8.metal",)


def _rows_cols(A: torch.Tensor) -> tuple[int, int]:
    return prod(A.shape[:-1]), A.shape[-1]


def _threshold_in(A: torch.Tensor, threshold: float) -> float:
    """The threshold as the reference's ``A.abs() >= threshold`` sees it: rounded to A's dtype."""
    return torch.tensor(threshold, dtype=A.dtype).item()


def _row_group(cols: int) -> int:
    """Threads per row in int8_row_quant: whole SIMD-groups, at most GROUP, no idle group for narrow rows."""
    return min(GROUP, (cols + 31) // 32 * 32)


def dequant_geometry(rows: int, cols: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """(threads, group_size) of the dequantizers' 2-D grid, x the column and y the row (rows, cols > 0): up to
    GROUP threads a group, whole rows stacked when they are narrow. Partial edge groups are Metal's; the
    kernels do not depend on their size. Their 32-bit indices need rows * cols <= MAX_THREADS, which
    ``native(name, rows * cols)`` checks before every launch."""
    x = min(cols, GROUP)
    return (cols, rows), (x, min(rows, GROUP // x))


def int8_vectorwise_quant(A: torch.Tensor, threshold: float = 0.0):
    check_int8_vectorwise_quant(A, threshold)
    rows, cols = _rows_cols(A)
    sfx = suffix(A.dtype)
    group = _row_group(cols)
    if A.numel() == 0 or not native(f"int8_row_quant_{sfx}", rows * group):
        return _reference.int8_vectorwise_quant(A, threshold)
    A = A.contiguous()
    codes = torch.empty(A.shape, dtype=torch.int8, device=A.device)
    stats = torch.empty(rows, dtype=torch.float32, device=A.device)
    outliers = threshold > 0.0
    thr = _threshold_in(A, threshold) if outliers else 0.0
    if outliers:
        flags = torch.empty(cols, dtype=torch.uint8, device=A.device)
        threads, group_size = elementwise(cols)
        dispatch(f"int8_outlier_cols_{sfx}", A, thr, flags, rows, cols, threads=threads, group_size=group_size)
    else:
        flags = placeholder(A.device, torch.uint8)
    dispatch(f"int8_row_quant_{sfx}", A, thr, int(outliers), flags, codes, stats, cols,
             threads=rows * group, group_size=group)  # fmt: skip
    # nonzero waits for the GPU: the number of outlier columns decides the output's size (as on CUDA).
    outlier_cols = torch.nonzero(flags).view(-1) if outliers else None
    return codes, stats, outlier_cols


def int8_vectorwise_dequant(A: torch.Tensor, stats: torch.Tensor) -> torch.Tensor:
    check_int8_vectorwise_dequant(A, stats)
    n = A.numel()
    if n == 0 or not native("int8_vectorwise_dequant", n):
        return _reference.int8_vectorwise_dequant(A, stats)
    A = A.contiguous()
    out = torch.empty(A.shape, dtype=torch.float32, device=A.device)
    rows, cols = _rows_cols(A)
    threads, group_size = dequant_geometry(rows, cols)
    dispatch("int8_vectorwise_dequant", A, stats.contiguous(), out, _formats.INT8_DEQUANT_SCALE, rows, cols,
             threads=threads, group_size=group_size)  # fmt: skip
    return out


def int8_mm_dequant(A, row_stats, col_stats, dtype=None, bias=None) -> torch.Tensor:
    out_dtype = check_int8_mm_dequant(A, row_stats, col_stats, dtype, bias)
    n = A.numel()
    name = f"int8_mm_dequant_{suffix(out_dtype)}"
    if n == 0 or not native(name, n):
        return _reference.int8_mm_dequant(A, row_stats, col_stats, dtype, bias)
    A = A.contiguous()
    out = torch.empty(A.shape, dtype=out_dtype, device=A.device)
    b = placeholder(A.device) if bias is None else bias.contiguous().float()
    rows, cols = _rows_cols(A)
    threads, group_size = dequant_geometry(rows, cols)
    dispatch(name, A, row_stats.contiguous(), col_stats.contiguous(), b, int(bias is not None), out,
             _formats.INT8_MM_DEQUANT_SCALE, rows, cols, threads=threads, group_size=group_size)  # fmt: skip
    return out


OPS = {
    "int8_vectorwise_quant": int8_vectorwise_quant,
    "int8_vectorwise_dequant": int8_vectorwise_dequant,
    "int8_mm_dequant": int8_mm_dequant,
}
