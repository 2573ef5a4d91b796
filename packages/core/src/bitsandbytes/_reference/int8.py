"""Reference kernels for LLM.int8(): row-wise int8 quantization, exact int8 GEMM and dequantization.

Format (as upstream bitsandbytes 0.50):

* A ``[..., K]`` tensor is a stack of rows of K values. Each row has one fp32 scale, its absolute
  maximum (``stats``), and codes ``round(a * 127 / absmax)`` in ``[-127, 127]``, rounded half to
  even. Upstream computes the multiplier as ``fl(fl(1 / absmax) * 127)`` and then one fp32 product
  per element; we do the same so the codes are byte-identical.
* Dequantization multiplies by the scale and then by ``1/127`` (``7.874015718698502e-3``); the
  product of two such scales by ``6.200124e-05``. That is upstream's constant: it is not exactly
  ``1/127**2`` (``6.20001240e-05``) but it is what every checkpoint and client was produced with.
* Outliers (``threshold > 0``): every value with ``|a| >= threshold`` is left out of its row's
  absmax, and every column holding at least one outlier is returned (sorted, int64) and gets code 0
  in every row, so the int8 GEMM skips it and the caller adds it back in floating point.

Special values: a row whose absmax is 0 gets codes 0 and scale 0 (no division by zero). A NaN or
Inf in a row makes its scale non-finite, its codes 0, and so its dequantized values NaN: visible,
never a crash and never a device sync.
"""

from __future__ import annotations

from math import prod

import torch

from .. import _checks, _formats, _ops
from ._registry import reference

# 1/127 and upstream's 1/127**2 (see the module docstring), applied as fp32 multipliers.
DEQUANT_SCALE = _formats.INT8_DEQUANT_SCALE
MM_DEQUANT_SCALE = _formats.INT8_MM_DEQUANT_SCALE

# fp32 holds every integer up to 2**24 exactly, and an int8 x int8 product is at most 128 * 128 = 2**14
# in magnitude, so a dot product over 2**10 elements is exact in fp32 whatever the summation order.
EXACT_FP32_CHUNK = 1024


def _as_rows(A: torch.Tensor) -> torch.Tensor:
    """``[..., K]`` as a contiguous ``[rows, K]`` (K == 0 too), so that every output is contiguous as well."""
    return A.contiguous().view(prod(A.shape[:-1]), A.shape[-1])


def _absmax(A2: torch.Tensor, dim: int) -> torch.Tensor:
    """fp32 absolute maximum along ``dim`` of a 2-D tensor; 0 along an empty dimension. NaN propagates."""
    if A2.shape[dim] == 0:
        return torch.zeros(A2.shape[1 - dim], dtype=torch.float32, device=A2.device)
    return A2.abs().amax(dim=dim).float()


def _quantize(A2: torch.Tensor, absmax: torch.Tensor) -> torch.Tensor:
    """int8 codes of ``A2`` scaled by ``absmax`` (already shaped to broadcast against ``A2``)."""
    # reciprocal-then-multiply is how upstream evaluates ``127.0 / absmax``; keep it for identical bytes.
    scale = torch.reciprocal(absmax) * 127.0
    codes = torch.round(A2.float() * scale)
    # A zero (or non-finite) absmax gives 0 * inf = NaN here: define those codes as 0. The clamp is
    # a no-op for finite rows (|a| <= absmax) and keeps a subnormal absmax (1/absmax = inf) in range.
    return codes.nan_to_num(nan=0.0).clamp_(-127, 127).to(torch.int8)


def _outlier_mask(A2: torch.Tensor, threshold: float) -> torch.Tensor | None:
    # NaN compares false, so it is never an outlier; +-Inf always is.
    return A2.abs() >= threshold if threshold > 0.0 else None


def _outlier_cols(mask: torch.Tensor | None) -> torch.Tensor | None:
    if mask is None:
        return None
    return torch.nonzero(mask.any(dim=0)).view(-1)


@reference("int8_vectorwise_quant")
def int8_vectorwise_quant(A: torch.Tensor, threshold: float = 0.0):
    _ops.check_int8_vectorwise_quant(A, threshold)
    A2 = _as_rows(A)
    mask = _outlier_mask(A2, threshold)
    inliers = A2 if mask is None else A2.masked_fill(mask, 0)
    row_stats = _absmax(inliers, dim=1)
    codes = _quantize(inliers, row_stats.unsqueeze(1))
    outlier_cols = _outlier_cols(mask)
    if outlier_cols is not None:
        # The whole column goes to the fp path, so its inlier values are dropped from the int8 path too
        # (they still count in their row's absmax, as upstream).
        codes[:, outlier_cols] = 0
    return codes.reshape(A.shape), row_stats, outlier_cols


@reference("int8_vectorwise_dequant")
def int8_vectorwise_dequant(A: torch.Tensor, stats: torch.Tensor) -> torch.Tensor:
    _ops.check_int8_vectorwise_dequant(A, stats)
    out = _as_rows(A).float() * stats.reshape(-1, 1) * DEQUANT_SCALE
    return out.reshape(A.shape)


def _int8_matmul(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """``A @ B.T`` in exact integer arithmetic, as int32, on any device.

    Integer matmul is not available everywhere (CUDA has no int64 GEMM, MPS no float64, and
    ``torch._int_mm`` only some shapes), and a plain fp32 matmul rounds once partial sums pass 2**24
    (K > 1024). So K is cut into chunks whose fp32 dot products are exact, and the chunk results are
    summed in int64. The int32 result wraps modulo 2**32 only when the exact sum does not fit, which
    takes K > 131072; an int32-accumulating GEMM wraps there too.
    """
    A2 = _as_rows(A)
    M, K = A2.shape
    N = B.shape[0]
    acc = torch.zeros((M, N), dtype=torch.int64, device=A.device)
    for start in range(0, K, EXACT_FP32_CHUNK):
        stop = min(start + EXACT_FP32_CHUNK, K)
        part = A2[:, start:stop].float() @ B[:, start:stop].float().T
        acc += part.to(torch.int64)
    return acc.to(torch.int32).reshape(*A.shape[:-1], N)


@reference("int8_linear_matmul")
def int8_linear_matmul(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    _ops.check_int8_linear_matmul(A, B)
    return _int8_matmul(A, B)


@reference("int8_linear_matmul.out")
def int8_linear_matmul_out(A: torch.Tensor, B: torch.Tensor, out: torch.Tensor) -> None:
    _checks.out_tensor(out, _ops.check_int8_linear_matmul(A, B), torch.int32, A.device, reads={"A": A, "B": B})
    out.copy_(_int8_matmul(A, B))


def _mm_dequant_fp32(A: torch.Tensor, row_stats: torch.Tensor, col_stats: torch.Tensor, bias) -> torch.Tensor:
    """Dequantized int32 GEMM result in fp32, bias added, in A's shape (upstream's operation order)."""
    scales = row_stats.reshape(-1, 1) * col_stats.reshape(1, -1)
    out = _as_rows(A).float() * scales * MM_DEQUANT_SCALE
    if bias is not None:
        out = out + bias.float()
    return out.reshape(A.shape)


@reference("int8_mm_dequant")
def int8_mm_dequant(A, row_stats, col_stats, dtype=None, bias=None) -> torch.Tensor:
    out_dtype = _ops.check_int8_mm_dequant(A, row_stats, col_stats, dtype, bias)
    return _mm_dequant_fp32(A, row_stats, col_stats, bias).to(out_dtype)


@reference("int8_scaled_mm")
def int8_scaled_mm(A, B, row_stats, col_stats, bias=None, dtype=None) -> torch.Tensor:
    _, out_dtype = _ops.check_int8_scaled_mm(A, B, row_stats, col_stats, bias, dtype)
    return _mm_dequant_fp32(_int8_matmul(A, B), row_stats, col_stats, bias).to(out_dtype)


@reference("int8_mixed_scaled_mm")
def int8_mixed_scaled_mm(A, CA, CB, SCA, SCB, outlier_cols=None, bias=None):
    """``A @ W.T + bias`` with W given as int8 ``CB`` and scales ``SCB``; A's outlier columns in floating point.

    ``CA``/``SCA`` are A's int8 codes and row scales, with the outlier columns already zeroed (as
    ``int8_vectorwise_quant`` returns them). The outlier columns of A (``subA``, returned as the
    second output, ``[..., n_outliers]``) are multiplied with the dequantized matching columns of W.
    Everything is summed in fp32 and rounded once to A's dtype.
    """
    _ops.check_int8_mixed_scaled_mm(A, CA, CB, SCA, SCB, outlier_cols, bias)
    out = _mm_dequant_fp32(_int8_matmul(CA, CB), SCA, SCB, bias)
    cols = outlier_cols if outlier_cols is not None else torch.zeros(0, dtype=torch.int64, device=A.device)
    subA = A[..., cols]
    if cols.numel():
        subB = CB[:, cols].float() * SCB.reshape(-1, 1) * DEQUANT_SCALE
        out = out + subA.float() @ subB.T
    return out.to(A.dtype), subA


@reference("int8_double_quant")
def int8_double_quant(A: torch.Tensor, threshold: float = 0.0):
    """Row-wise codes (as ``int8_vectorwise_quant``) and column-wise codes of the same tensor.

    The column-wise side leaves the outlier values out of each column's absmax and codes them 0,
    but, like upstream, keeps the other values of an outlier column.
    """
    _ops.check_int8_double_quant(A, threshold)
    row_codes, row_stats, outlier_cols = int8_vectorwise_quant(A, threshold)
    A2 = _as_rows(A)
    mask = _outlier_mask(A2, threshold)
    inliers = A2 if mask is None else A2.masked_fill(mask, 0)
    col_stats = _absmax(inliers, dim=0)
    col_codes = _quantize(inliers, col_stats.unsqueeze(0))
    return row_codes, col_codes.reshape(A.shape), row_stats, col_stats, outlier_cols
