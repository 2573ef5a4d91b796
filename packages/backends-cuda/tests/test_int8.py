"""The int8 family on its emulated CUDA kernels against the reference: bytes of codes and stats exactly,
outlier columns exactly, dequantized values exactly (same fp32 operation order as the reference)."""

from __future__ import annotations

import pytest
import torch

from bitsandbytes._reference import int8 as ref
from bitsandbytes_cuda.ops import int8 as ops

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _data(shape, dtype, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(dtype)


def _special(dtype):
    """Rows that stress the format: all zero, one NaN, one inf, a tiny absmax, ties at .5 code steps."""
    A = _data((6, 37), dtype, seed=3)
    A[0] = 0
    A[1, 5] = float("nan")
    A[2, 7] = float("inf")
    A[3] = A[3] * 1e-30 if dtype == torch.float32 else A[3] * 1e-6
    A[4] = torch.linspace(-127, 127, 37).to(dtype) / 2  # many values land on x.5 code steps
    return A


def _same(actual, expected):
    assert (actual is None) == (expected is None)
    if expected is not None:
        assert actual.dtype == expected.dtype and actual.shape == expected.shape
        torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (3, 300), (2, 2, 33), (5, 0), (0, 7)])
def test_vectorwise_quant_is_the_reference(emulated, dtype, shape):
    A = _data(shape, dtype)
    for got, want in zip(ops.int8_vectorwise_quant(A), ref.int8_vectorwise_quant(A), strict=True):
        _same(got, want)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("threshold", [0.0, 1.5, 6.0, 100.0])
def test_vectorwise_quant_outliers(emulated, dtype, threshold):
    A = _data((9, 70), dtype, seed=1, scale=2.0)
    got = ops.int8_vectorwise_quant(A, threshold)
    want = ref.int8_vectorwise_quant(A, threshold)
    for g, w in zip(got, want, strict=True):
        _same(g, w)
    if threshold == 1.5:  # the case must exercise outliers, or it proves nothing
        assert got[2].numel() > 0 and (got[0][:, got[2]] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_special_values(emulated, dtype):
    A = _special(dtype)
    for threshold in (0.0, 3.0):
        for g, w in zip(ops.int8_vectorwise_quant(A, threshold), ref.int8_vectorwise_quant(A, threshold), strict=True):
            _same(g, w)
        for g, w in zip(ops.int8_double_quant(A, threshold), ref.int8_double_quant(A, threshold), strict=True):
            _same(g, w)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 5), (40, 33), (3, 4, 65), (0, 4)])
@pytest.mark.parametrize("threshold", [0.0, 2.0])
def test_double_quant_is_the_reference(emulated, dtype, shape, threshold):
    A = _data(shape, dtype, seed=2, scale=1.5)
    for g, w in zip(ops.int8_double_quant(A, threshold), ref.int8_double_quant(A, threshold), strict=True):
        _same(g, w)


@pytest.mark.parametrize("shape", [(1, 1), (4, 129), (2, 3, 17)])
def test_vectorwise_dequant_is_the_reference(emulated, shape):
    g = torch.Generator().manual_seed(4)
    A = torch.randint(-127, 128, shape, generator=g, dtype=torch.int8)
    stats = torch.rand(A.numel() // shape[-1], generator=g) * 5
    _same(ops.int8_vectorwise_dequant(A, stats), ref.int8_vectorwise_dequant(A, stats))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias_dtype", [None, torch.float32, torch.float16])
def test_mm_dequant_is_the_reference(emulated, dtype, bias_dtype):
    g = torch.Generator().manual_seed(5)
    A = torch.randint(-(2**20), 2**20, (2, 3, 40), generator=g, dtype=torch.int32)
    row, col = torch.rand(6, generator=g) * 3, torch.rand(40, generator=g) * 3
    bias = None if bias_dtype is None else torch.randn(40, generator=g).to(bias_dtype)
    _same(ops.int8_mm_dequant(A, row, col, dtype, bias), ref.int8_mm_dequant(A, row, col, dtype, bias))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_scaled_and_mixed_mm_are_the_reference(emulated, dtype):
    A = _data((5, 48), dtype, seed=6, scale=2.0)
    W = _data((24, 48), dtype, seed=7)
    CA, SCA, cols = ref.int8_vectorwise_quant(A, 3.0)
    CB, SCB, _ = ref.int8_vectorwise_quant(W)
    bias = torch.randn(24, generator=torch.Generator().manual_seed(8)).to(dtype)
    _same(ops.int8_linear_matmul(CA, CB), ref.int8_linear_matmul(CA, CB))
    _same(ops.int8_scaled_mm(CA, CB, SCA, SCB, bias, dtype), ref.int8_scaled_mm(CA, CB, SCA, SCB, bias, dtype))
    assert cols.numel() > 0
    got = ops.int8_mixed_scaled_mm(A, CA, CB, SCA, SCB, cols, bias)
    want = ref.int8_mixed_scaled_mm(A, CA, CB, SCA, SCB, cols, bias)
    _same(got[1], want[1])
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)


def test_linear_matmul_out(emulated):
    g = torch.Generator().manual_seed(9)
    A = torch.randint(-127, 128, (3, 16), generator=g, dtype=torch.int8)
    B = torch.randint(-127, 128, (8, 16), generator=g, dtype=torch.int8)
    out = torch.empty(3, 8, dtype=torch.int32)
    ops.int8_linear_matmul_out(A, B, out)
    _same(out, ref.int8_linear_matmul(A, B))


def test_int_mm_shape_rule():
    # torch._int_mm's CUDA requirements on K and N; fewer than 17 rows are padded, everything else takes
    # the reference's exact product.
    assert ops._int_mm_accepts(8, 8)
    assert not ops._int_mm_accepts(12, 8)
    assert not ops._int_mm_accepts(8, 12)
    assert not ops._int_mm_accepts(0, 8)


def test_errors_are_the_references(emulated):
    A = torch.zeros(2, 3, dtype=torch.int8)
    with pytest.raises(TypeError, match="stats"):
        ops.int8_vectorwise_dequant(A, torch.zeros(2, dtype=torch.float16))
    with pytest.raises(ValueError, match="threshold"):
        ops.int8_vectorwise_quant(torch.zeros(2, 3), -1.0)


@pytest.mark.parametrize("threshold", [0.0, 2.5])
def test_double_quant_column_stats_merge_across_row_blocks(emulated, threshold):
    # 600 rows: the column absmax kernel splits them over several blocks that merge with atomicMax.
    A = _data((600, 40), torch.float16, seed=10)
    A[450, 3] = 9.0  # the largest value of its column sits in a late block
    A[599, 7] = float("nan")
    A[10, 8] = -float("nan")
    for g, w in zip(ops.int8_double_quant(A, threshold), ref.int8_double_quant(A, threshold), strict=True):
        _same(g, w)
