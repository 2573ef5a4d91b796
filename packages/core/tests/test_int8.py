"""LLM.int8() ops and functions on the reference kernels: formats, exactness, outliers, edge cases, bad input.

Expected values come from hand computation, float64/int64 math, or upstream 0.50's formulas and
constants; never from the code under test.
"""

import inspect

import pytest
import torch

import bitsandbytes.functional as F

ops = torch.ops.bitsandbytes
FLOATS = (torch.float16, torch.bfloat16, torch.float32)
# Upstream's dequantization multipliers, as fp32.
INV127 = torch.tensor(7.874015718698502e-3, dtype=torch.float32)
INV127SQ = torch.tensor(6.200124e-05, dtype=torch.float32)


def f32(x):
    return torch.tensor(x, dtype=torch.float32)


def rand_rows(shape, dtype, seed=0):
    """Values in (-5, 5) with a different scale per row: below the outlier threshold 6 used here."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.rand((*shape[:-1], 1), generator=g) * 4.9 + 0.1
    return ((torch.rand(shape, generator=g) * 2 - 1) * scale).to(dtype)


# ---------------------------------------------------------------------------------------------------
# int8_vectorwise_quant / int8_vectorwise_dequant


def test_vectorwise_quant_hand_example():
    A = torch.tensor([[1.0, -2.0, 0.5], [0.25, 0.125, -1.0]])
    codes, stats, outliers = F.int8_vectorwise_quant(A)
    # row 0: absmax 2, multiplier 63.5: 63.5 -> 64 (even), -127, 31.75 -> 32
    # row 1: absmax 1, multiplier 127: 31.75 -> 32, 15.875 -> 16, -127
    assert codes.dtype == torch.int8
    assert codes.tolist() == [[64, -127, 32], [32, 16, -127]]
    assert stats.dtype == torch.float32 and stats.tolist() == [2.0, 1.0]
    assert outliers is None


def test_vectorwise_quant_rounds_half_to_even():
    # absmax 254 makes the multiplier exactly 0.5, so odd values land on exact ties.
    A = torch.tensor([[254.0, 1.0, 3.0, 5.0, -3.0, -1.0, 7.0]])
    codes, _, _ = F.int8_vectorwise_quant(A)
    assert codes.tolist() == [[127, 0, 2, 2, -2, 0, 4]]  # half away from zero would give 1, 2, 3, -2, -1, 4


def test_vectorwise_quant_uses_upstreams_multiplier():
    # Upstream computes fl(fl(1/absmax) * 127) and then one product; at these exact ties (a = absmax/2) that
    # differs from a * 127 / absmax (first row) and from a * fl(127 / absmax) (second row).
    A = torch.tensor([[29.796875, 14.8984375], [78.625, 39.3125]], dtype=torch.float16)
    codes, stats, _ = F.int8_vectorwise_quant(A)
    assert codes[:, 1].tolist() == [63, 64]
    assert stats.tolist() == [29.796875, 78.625]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(1, 1), (5, 3), (17, 129), (4, 1000), (7,)])
def test_vectorwise_quant_matches_float64_math(dtype, shape):
    A = rand_rows(shape, dtype)
    codes, stats, _ = F.int8_vectorwise_quant(A)
    A2 = A.double().reshape(-1, shape[-1])
    absmax = A2.abs().amax(dim=1)
    assert codes.shape == A.shape and stats.shape == (A2.shape[0],)
    assert torch.equal(stats.double(), absmax)
    exact = A2 * 127 / absmax[:, None]
    # Within half a step of the exact value (plus fp32 rounding of the multiplier), and the absmax hits +-127.
    assert (codes.reshape(A2.shape).double() - exact).abs().max() <= 0.5 + 1e-4
    assert torch.equal(codes.reshape(A2.shape).abs().amax(dim=1), torch.full((A2.shape[0],), 127, dtype=torch.int8))


@pytest.mark.parametrize("dtype", FLOATS)
def test_vectorwise_dequant_round_trip(dtype):
    A = rand_rows((33, 65), dtype, seed=3)
    codes, stats, _ = F.int8_vectorwise_quant(A)
    out = F.int8_vectorwise_dequant(codes, stats)
    assert out.dtype == torch.float32 and out.shape == A.shape
    step = A.float().abs().amax(dim=1, keepdim=True) / 127
    assert ((out - A.float()).abs() <= step / 2 * (1 + 1e-3)).all()


def test_vectorwise_dequant_hand_example_and_operation_order():
    codes = torch.tensor([[127, -64, 0, 1]], dtype=torch.int8)
    stats = torch.tensor([3.0])
    out = F.int8_vectorwise_dequant(codes, stats)
    # (code * stat) in fp32, then times fp32(1/127): upstream's order, so the bytes match.
    expected = (codes.float() * f32(3.0)) * INV127
    assert torch.equal(out, expected)
    assert out[0, 0].item() == pytest.approx(3.0, rel=1e-6)
    assert out[0, 1].item() == pytest.approx(-64 * 3 / 127, rel=1e-6)


def test_vectorwise_quant_batched_equals_flattened():
    A = rand_rows((2, 3, 7), torch.float16, seed=5)
    A[1, 2, 4] = 50.0  # an outlier in column 4
    codes, stats, cols = F.int8_vectorwise_quant(A, threshold=6.0)
    codes2, stats2, cols2 = F.int8_vectorwise_quant(A.reshape(6, 7), threshold=6.0)
    assert codes.shape == (2, 3, 7) and stats.shape == (6,)
    assert torch.equal(codes.reshape(6, 7), codes2) and torch.equal(stats, stats2) and torch.equal(cols, cols2)
    assert cols.tolist() == [4]
    deq = F.int8_vectorwise_dequant(codes, stats)
    assert deq.shape == (2, 3, 7)
    assert torch.equal(deq.reshape(6, 7), F.int8_vectorwise_dequant(codes2, stats2))


def test_vectorwise_quant_non_contiguous_input_is_read_as_is():
    A = rand_rows((9, 20), torch.float32, seed=7)
    At = A.t()  # non-contiguous view, [20, 9]
    codes, stats, _ = F.int8_vectorwise_quant(At)
    codes_c, stats_c, _ = F.int8_vectorwise_quant(At.contiguous())
    assert codes.is_contiguous()
    assert torch.equal(codes, codes_c) and torch.equal(stats, stats_c)


def test_all_zero_rows_have_zero_scale_and_codes():
    A = torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.0, -0.5], [-0.0, 0.0, -0.0]], dtype=torch.float16)
    codes, stats, _ = F.int8_vectorwise_quant(A)
    assert stats.tolist() == [0.0, 1.0, 0.0]
    assert codes[0].tolist() == [0, 0, 0] and codes[2].tolist() == [0, 0, 0]
    out = F.int8_vectorwise_dequant(codes, stats)
    assert torch.isfinite(out).all() and out[0].tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("threshold", [0.0, 1.0])
@pytest.mark.parametrize("shape", [(0, 5), (3, 0), (0, 0), (0,), (2, 0, 4)])
def test_vectorwise_quant_empty(shape, threshold):
    A = torch.empty(shape, dtype=torch.float16)
    codes, stats, cols = F.int8_vectorwise_quant(A, threshold)
    rows = 1 if len(shape) == 1 else shape[0] * (shape[1] if len(shape) == 3 else 1)
    assert codes.shape == shape and codes.dtype == torch.int8
    assert stats.shape == (rows,) and (stats == 0).all()
    if threshold == 0.0:
        assert cols is None
    else:
        assert cols.dtype == torch.int64 and cols.numel() == 0
    assert F.int8_vectorwise_dequant(codes, stats).shape == shape


def test_nan_or_inf_makes_only_its_row_non_finite():
    A = torch.tensor([[1.0, float("nan"), 2.0], [1.0, float("inf"), 2.0], [1.0, 2.0, 4.0]])
    codes, stats, _ = F.int8_vectorwise_quant(A)
    assert stats[0].isnan() and stats[1].isinf() and stats[2].item() == 4.0
    assert codes[:2].eq(0).all()  # no garbage from NaN -> int8 casts
    assert codes[2].tolist() == [32, 64, 127]
    out = F.int8_vectorwise_dequant(codes, stats)
    assert out[:2].isnan().all() and torch.isfinite(out[2]).all()


def test_inf_is_an_outlier_and_nan_is_not():
    A = torch.tensor([[1.0, float("inf"), 2.0], [float("nan"), 1.0, 1.0]])
    codes, stats, cols = F.int8_vectorwise_quant(A, threshold=6.0)
    assert cols.tolist() == [1]
    assert stats[0].item() == 2.0 and stats[1].isnan()
    assert codes[0].tolist() == [64, 0, 127]


# ---------------------------------------------------------------------------------------------------
# Outliers (threshold > 0)


def test_outlier_hand_example():
    A = torch.tensor(
        [[1.0, 10.0, 2.0], [-8.0, 0.5, 1.0], [3.0, 1.0, 1.0], [1.0, 1.0, 4.0]],
        dtype=torch.float16,
    )
    before = A.clone()
    codes, stats, cols = F.int8_vectorwise_quant(A, threshold=6.0)
    # Outliers (|a| >= 6): (0, 1) and (1, 0); columns 0 and 1 go to the fp path.
    assert cols.dtype == torch.int64 and cols.tolist() == [0, 1]
    # Outlier values leave the row absmax; inlier values of outlier columns stay in it (row 2: 3.0).
    assert stats.tolist() == [2.0, 1.0, 3.0, 4.0]
    # Outlier columns are 0 in every row; column 2 is quantized with those scales: 127, 127, 42.33 -> 42, 127.
    assert codes.tolist() == [[0, 0, 127], [0, 0, 127], [0, 0, 42], [0, 0, 127]]
    assert torch.equal(A, before)  # the input is never modified, not even temporarily visible


def test_threshold_is_inclusive_and_columns_sorted_unique():
    A = torch.zeros(5, 8)
    A[4, 6] = 6.0  # exactly the threshold: an outlier
    A[0, 6] = -7.0
    A[2, 1] = 5.99  # just below: not an outlier
    A[3, 3] = 100.0
    _, _, cols = F.int8_vectorwise_quant(A, threshold=6.0)
    assert cols.tolist() == [3, 6]


def test_threshold_without_outliers_returns_empty_columns():
    A = rand_rows((4, 6), torch.float16)
    codes, stats, cols = F.int8_vectorwise_quant(A, threshold=1000.0)
    codes0, stats0, cols0 = F.int8_vectorwise_quant(A)
    assert cols.dtype == torch.int64 and cols.shape == (0,)
    assert cols0 is None
    assert torch.equal(codes, codes0) and torch.equal(stats, stats0)


def test_single_row_outlier_column_is_zero():
    A = torch.tensor([[1.0, 100.0, -2.0, 0.0]])
    codes, stats, cols = F.int8_vectorwise_quant(A, threshold=6.0)
    assert cols.tolist() == [1] and stats.tolist() == [2.0]
    assert codes.tolist() == [[64, 0, -127, 0]]


# ---------------------------------------------------------------------------------------------------
# int8_linear_matmul


def int64_matmul(A, B):
    """A [M, K] @ B [N, K].T in int64 by explicit broadcasting: independent of any GEMM."""
    return (A.long()[:, None, :] * B.long()[None, :, :]).sum(-1)


def test_linear_matmul_hand_example():
    A = torch.tensor([[1, 2, 3], [-128, 127, 0]], dtype=torch.int8)
    B = torch.tensor([[1, 0, -1], [2, 2, 2]], dtype=torch.int8)
    out = F.int8_linear_matmul(A, B)
    assert out.dtype == torch.int32
    assert out.tolist() == [[-2, 12], [-128, -2]]


def test_linear_matmul_is_exact_beyond_fp32_integers():
    # 2048 * 127**2 + 1 = 33032193 is odd and above 2**25: a plain fp32 GEMM cannot represent it.
    K = 2049
    A = torch.full((1, K), 127, dtype=torch.int8)
    A[0, -1] = 1
    out = F.int8_linear_matmul(A, A)
    assert out.item() == 2048 * 127 * 127 + 1
    assert (A.float() @ A.float().T).item() != 2048 * 127 * 127 + 1  # the trap this test guards


def test_linear_matmul_large_k_random_matches_int64():
    g = torch.Generator().manual_seed(11)
    A = torch.randint(-128, 128, (3, 8192), dtype=torch.int8, generator=g)
    B = torch.randint(-128, 128, (5, 8192), dtype=torch.int8, generator=g)
    A[0] = 127
    B[0] = 127
    B[1] = -128
    A[1] = -128
    out = F.int8_linear_matmul(A, B)
    assert torch.equal(out.long(), int64_matmul(A, B))
    assert out[0, 0].item() == 8192 * 127 * 127 and out[1, 1].item() == 8192 * 128 * 128


def test_linear_matmul_wraps_like_int32_accumulation_on_overflow():
    K = 140_000  # 140000 * 128 * 128 > 2**31
    A = torch.full((1, K), -128, dtype=torch.int8)
    exact = K * 128 * 128
    wrapped = (exact + 2**31) % 2**32 - 2**31
    assert F.int8_linear_matmul(A, A).item() == wrapped


@pytest.mark.parametrize("shapeA,N", [((2, 3, 5), 4), ((5,), 3), ((1, 1), 1), ((7, 33), 9)])
def test_linear_matmul_batched_and_odd_shapes(shapeA, N):
    g = torch.Generator().manual_seed(2)
    A = torch.randint(-128, 128, shapeA, dtype=torch.int8, generator=g)
    B = torch.randint(-128, 128, (N, shapeA[-1]), dtype=torch.int8, generator=g)
    out = F.int8_linear_matmul(A, B)
    assert out.shape == (*shapeA[:-1], N)
    assert torch.equal(out.reshape(-1, N).long(), int64_matmul(A.reshape(-1, shapeA[-1]), B))


@pytest.mark.parametrize("shapeA,shapeB", [((0, 4), (3, 4)), ((2, 4), (0, 4)), ((2, 0), (3, 0)), ((0, 0), (0, 0))])
def test_linear_matmul_empty(shapeA, shapeB):
    A = torch.empty(shapeA, dtype=torch.int8)
    B = torch.empty(shapeB, dtype=torch.int8)
    out = F.int8_linear_matmul(A, B)
    assert out.shape == (shapeA[0], shapeB[0]) and out.dtype == torch.int32
    assert (out == 0).all()


def test_linear_matmul_out_overload():
    A = torch.tensor([[1, 2], [3, 4], [5, 6]], dtype=torch.int8)
    B = torch.tensor([[1, -1]], dtype=torch.int8)
    out = torch.full((3, 1), 99, dtype=torch.int32)
    assert ops.int8_linear_matmul.out(A, B, out) is None
    assert out.tolist() == [[-1], [-1], [-1]]
    out2 = torch.zeros(3, 1, dtype=torch.int32)
    assert F.int8_linear_matmul(A, B, out=out2) is out2
    assert out2.tolist() == [[-1], [-1], [-1]]


# ---------------------------------------------------------------------------------------------------
# int8_mm_dequant / int8_scaled_mm


def test_mm_dequant_uses_upstreams_constant():
    A = torch.tensor([[1]], dtype=torch.int32)
    one = torch.ones(1)
    out = ops.int8_mm_dequant(A, one, one, dtype=torch.float32)
    # Upstream's 6.200124e-05, which is not fp32(1/127**2) = 6.2000124e-05.
    assert out.item() == INV127SQ.item()
    assert out.item() != f32(1 / 127**2).item()


def test_mm_dequant_hand_example_and_operation_order():
    A = torch.tensor([[16129, -100], [0, 7]], dtype=torch.int32)
    row = torch.tensor([127.0, 2.0])
    col = torch.tensor([127.0, 0.5])
    bias = torch.tensor([0.25, -1.0])
    out = ops.int8_mm_dequant(A, row, col, dtype=torch.float32, bias=bias)
    # A * (row x col) * c + bias in fp32, upstream's order.
    expected = A.float() * (row[:, None] * col[None, :]) * INV127SQ + bias
    assert torch.equal(out, expected)
    assert out[0, 0].item() == pytest.approx(16129 * 127 * 127 * 6.200124e-05 + 0.25, rel=1e-6)
    assert out[1, 1].item() == pytest.approx(7 * 2 * 0.5 * 6.200124e-05 - 1.0, rel=1e-6)


@pytest.mark.parametrize("dtype", [None, *FLOATS])
@pytest.mark.parametrize("bias_dtype", [None, *FLOATS])
def test_mm_dequant_dtypes_and_bias(dtype, bias_dtype):
    g = torch.Generator().manual_seed(4)
    A = torch.randint(-(2**20), 2**20, (5, 7), dtype=torch.int32, generator=g)
    row = torch.rand(5, generator=g) * 10
    col = torch.rand(7, generator=g) * 10
    bias = None if bias_dtype is None else torch.randn(7, generator=g).to(bias_dtype)
    out = ops.int8_mm_dequant(A, row, col, dtype=dtype, bias=bias)
    assert out.dtype == (dtype or torch.float16)  # fp16 by default, as upstream
    exact = A.double() * row.double()[:, None] * col.double()[None, :] * 6.200124e-05
    if bias is not None:
        exact = exact + bias.double()
    # fp32 math then one rounding to the output dtype.
    tol = {torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float32: 1e-6}[out.dtype]
    torch.testing.assert_close(out.double(), exact, rtol=tol, atol=tol)


def test_mm_dequant_batched_keeps_shape():
    g = torch.Generator().manual_seed(6)
    A = torch.randint(-1000, 1000, (2, 3, 4), dtype=torch.int32, generator=g)
    row = torch.rand(6, generator=g)
    col = torch.rand(4, generator=g)
    out = ops.int8_mm_dequant(A, row, col, dtype=torch.float32)
    assert out.shape == (2, 3, 4)
    assert torch.equal(out.reshape(6, 4), ops.int8_mm_dequant(A.reshape(6, 4), row, col, dtype=torch.float32))


@pytest.mark.parametrize("shape", [(0, 3), (3, 0), (0, 0)])
def test_mm_dequant_empty(shape):
    A = torch.empty(shape, dtype=torch.int32)
    out = ops.int8_mm_dequant(A, torch.empty(shape[0]), torch.empty(shape[1]))
    assert out.shape == shape and out.dtype == torch.float16


def test_functional_mm_dequant_is_fp16_and_fills_out():
    A = torch.tensor([[16129, -16129]], dtype=torch.int32)
    row = torch.tensor([2.0])
    col = torch.tensor([1.0, 3.0])
    res = F.int8_mm_dequant(A, row, col)
    assert res.dtype == torch.float16
    out = torch.empty(1, 2, dtype=torch.float32)
    assert F.int8_mm_dequant(A, row, col, out=out) is out
    assert torch.equal(out, res.float())
    with_bias = F.int8_mm_dequant(A, row, col, bias=torch.tensor([1.0, 1.0], dtype=torch.float16))
    torch.testing.assert_close(with_bias.float(), res.float() + 1, rtol=1e-3, atol=0)


@pytest.mark.parametrize("dtype", [None, *FLOATS])
def test_scaled_mm_is_matmul_then_dequant(dtype):
    g = torch.Generator().manual_seed(8)
    A = torch.randint(-128, 128, (2, 3, 40), dtype=torch.int8, generator=g)
    B = torch.randint(-128, 128, (5, 40), dtype=torch.int8, generator=g)
    row = torch.rand(6, generator=g)
    col = torch.rand(5, generator=g)
    bias = torch.randn(5, generator=g)
    out = ops.int8_scaled_mm(A, B, row, col, bias=bias, dtype=dtype)
    assert out.shape == (2, 3, 5) and out.dtype == (dtype or torch.float16)
    i32 = int64_matmul(A.reshape(6, 40), B).int()
    expected = ops.int8_mm_dequant(i32, row, col, dtype=dtype, bias=bias)
    assert torch.equal(out.reshape(6, 5), expected)


@pytest.mark.parametrize("dtype", FLOATS)
def test_quantized_linear_approximates_float_linear(dtype):
    X = rand_rows((6, 64), dtype, seed=9)
    W = rand_rows((10, 64), dtype, seed=10)
    CA, SCA, _ = F.int8_vectorwise_quant(X)
    CB, SCB, _ = F.int8_vectorwise_quant(W)
    out = ops.int8_scaled_mm(CA, CB, SCA, SCB, dtype=dtype)
    ref = X.double() @ W.double().T
    err = (out.double() - ref).abs().max() / ref.abs().max()
    assert err < 0.02


# ---------------------------------------------------------------------------------------------------
# int8_mixed_scaled_mm


@pytest.mark.parametrize("dtype", FLOATS)
def test_mixed_scaled_mm_adds_outlier_columns_in_float(dtype):
    X = rand_rows((6, 32), dtype, seed=12)
    X[:, 5] = 40.0  # an outlier feature
    X[2, 17] = -30.0
    W = rand_rows((4, 32), dtype, seed=13)
    bias = torch.randn(4).to(dtype)
    CA, SCA, cols = F.int8_vectorwise_quant(X, threshold=6.0)
    CB, SCB, _ = F.int8_vectorwise_quant(W)
    assert cols.tolist() == [5, 17]
    out, subA = ops.int8_mixed_scaled_mm(X, CA, CB, SCA, SCB, cols, bias)
    assert out.dtype == dtype and out.shape == (6, 4)
    assert torch.equal(subA, X[:, cols])
    # Independent float64 evaluation of the same decomposition.
    Wdq = CB.double() * SCB.double()[:, None] / 127
    Xdq = CA.double() * SCA.double()[:, None] / 127
    expected = Xdq @ Wdq.T + X[:, cols].double() @ Wdq[:, cols].T + bias.double()
    tol = {torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float32: 1e-5}[dtype]
    torch.testing.assert_close(out.double(), expected, rtol=tol, atol=tol * expected.abs().max().item())
    # And the decomposition beats quantizing the outliers along with everything else.
    ref = X.double() @ W.double().T + bias.double()
    CA0, SCA0, _ = F.int8_vectorwise_quant(X)
    plain = ops.int8_scaled_mm(CA0, CB, SCA0, SCB, bias=bias, dtype=dtype)
    assert (out.double() - ref).abs().max() < (plain.double() - ref).abs().max()


@pytest.mark.parametrize("cols", [None, torch.empty(0, dtype=torch.int64)])
def test_mixed_scaled_mm_without_outliers_is_scaled_mm(cols):
    X = rand_rows((3, 16), torch.float16, seed=14)
    W = rand_rows((5, 16), torch.float16, seed=15)
    CA, SCA, _ = F.int8_vectorwise_quant(X)
    CB, SCB, _ = F.int8_vectorwise_quant(W)
    out, subA = ops.int8_mixed_scaled_mm(X, CA, CB, SCA, SCB, cols, None)
    assert subA.shape == (3, 0) and subA.dtype == torch.float16
    assert torch.equal(out, ops.int8_scaled_mm(CA, CB, SCA, SCB, dtype=torch.float16))


def test_mixed_scaled_mm_batched():
    X = rand_rows((2, 3, 16), torch.float32, seed=16)
    X[..., 2] = 20.0
    W = rand_rows((5, 16), torch.float32, seed=17)
    CA, SCA, cols = F.int8_vectorwise_quant(X, threshold=6.0)
    CB, SCB, _ = F.int8_vectorwise_quant(W)
    out, subA = ops.int8_mixed_scaled_mm(X, CA, CB, SCA, SCB, cols, None)
    flat, subA_flat = ops.int8_mixed_scaled_mm(X.reshape(6, 16), CA.reshape(6, 16), CB, SCA, SCB, cols, None)
    assert out.shape == (2, 3, 5) and subA.shape == (2, 3, 1)
    torch.testing.assert_close(out.reshape(6, 5), flat, rtol=1e-6, atol=1e-5)
    assert torch.equal(subA.reshape(6, 1), subA_flat)


# ---------------------------------------------------------------------------------------------------
# int8_double_quant


def test_double_quant_hand_example():
    A = torch.tensor([[1.0, -2.0], [4.0, 0.5], [0.0, 0.0]])
    row_codes, col_codes, row_stats, col_stats, cols = F.int8_double_quant(A)
    assert row_stats.tolist() == [2.0, 4.0, 0.0]
    assert col_stats.tolist() == [4.0, 2.0]
    assert row_codes.tolist() == [[64, -127], [127, 16], [0, 0]]
    # column 0: multiplier 31.75: 31.75 -> 32, 127, 0; column 1: 63.5: -127, 31.75 -> 32, 0
    assert col_codes.tolist() == [[32, -127], [127, 32], [0, 0]]
    assert cols is None


def test_double_quant_outliers():
    A = torch.tensor([[1.0, 10.0, 2.0], [-8.0, 0.5, 1.0], [3.0, 1.0, 1.0]], dtype=torch.float16)
    row_codes, col_codes, row_stats, col_stats, cols = F.int8_double_quant(A, threshold=6.0)
    codes, stats, cols1 = F.int8_vectorwise_quant(A, threshold=6.0)
    assert torch.equal(row_codes, codes) and torch.equal(row_stats, stats) and torch.equal(cols, cols1)
    # Columns: outliers leave the absmax and become 0; other values of outlier columns stay.
    assert col_stats.tolist() == [3.0, 1.0, 2.0]
    assert col_codes.tolist() == [[42, 0, 127], [0, 64, 64], [127, 127, 64]]


@pytest.mark.parametrize("dtype", FLOATS)
def test_double_quant_columns_are_rows_of_the_transpose(dtype):
    A = rand_rows((9, 13), dtype, seed=18)
    _, col_codes, _, col_stats, _ = F.int8_double_quant(A)
    t_codes, t_stats, _ = F.int8_vectorwise_quant(A.t().contiguous())
    assert torch.equal(col_codes, t_codes.t()) and torch.equal(col_stats, t_stats)


@pytest.mark.parametrize("shape", [(0, 4), (3, 0), (2, 3, 4)])
def test_double_quant_shapes(shape):
    A = torch.ones(shape, dtype=torch.float16)
    row_codes, col_codes, row_stats, col_stats, cols = F.int8_double_quant(A, threshold=6.0)
    assert row_codes.shape == col_codes.shape == shape
    assert row_stats.shape == (torch.Size(shape).numel() // shape[-1] if shape[-1] else shape[0],)
    assert col_stats.shape == (shape[-1],)
    assert cols.dtype == torch.int64 and cols.numel() == 0


# ---------------------------------------------------------------------------------------------------
# Public signatures (clients call these positionally)


@pytest.mark.parametrize(
    "name,params",
    [
        ("int8_vectorwise_quant", [("A", inspect.Parameter.empty), ("threshold", 0.0)]),
        ("int8_vectorwise_dequant", [("A", inspect.Parameter.empty), ("stats", inspect.Parameter.empty)]),
        (
            "int8_linear_matmul",
            [("A", inspect.Parameter.empty), ("B", inspect.Parameter.empty), ("out", None), ("dtype", torch.int32)],
        ),
        (
            "int8_mm_dequant",
            [
                ("A", inspect.Parameter.empty),
                ("row_stats", inspect.Parameter.empty),
                ("col_stats", inspect.Parameter.empty),
                ("out", None),
                ("bias", None),
            ],
        ),
        (
            "int8_double_quant",
            [
                ("A", inspect.Parameter.empty),
                ("col_stats", None),
                ("row_stats", None),
                ("out_col", None),
                ("out_row", None),
                ("threshold", 0.0),
            ],
        ),
    ],
)
def test_public_signatures_match_upstream(name, params):
    sig = inspect.signature(getattr(F, name))
    assert [(p.name, p.default) for p in sig.parameters.values()] == params
    assert name in F.__all__


# ---------------------------------------------------------------------------------------------------
# Bad input: each class raises TypeError/ValueError naming the argument.

f16 = torch.ones(2, 3, dtype=torch.float16)
i8 = torch.ones(2, 3, dtype=torch.int8)
i32 = torch.ones(2, 3, dtype=torch.int32)
s2 = torch.ones(2)
s3 = torch.ones(3)
meta = "meta"

BAD_CALLS = [
    # int8_vectorwise_quant
    ("vq dtype", lambda: ops.int8_vectorwise_quant(i8), TypeError, "A"),
    ("vq 0-d", lambda: ops.int8_vectorwise_quant(torch.tensor(1.0)), ValueError, "A"),
    ("vq negative threshold", lambda: ops.int8_vectorwise_quant(f16, -1.0), ValueError, "threshold"),
    ("vq nan threshold", lambda: ops.int8_vectorwise_quant(f16, float("nan")), ValueError, "threshold"),
    ("F vq not a tensor", lambda: F.int8_vectorwise_quant([[1.0]]), TypeError, "A"),
    ("F vq dtype", lambda: F.int8_vectorwise_quant(i32), TypeError, "A"),
    # int8_vectorwise_dequant
    ("vd dtype A", lambda: ops.int8_vectorwise_dequant(f16, s2), TypeError, "A"),
    ("vd dtype stats", lambda: ops.int8_vectorwise_dequant(i8, s2.half()), TypeError, "stats"),
    ("vd stats length", lambda: ops.int8_vectorwise_dequant(i8, s3), ValueError, "stats"),
    ("vd device", lambda: ops.int8_vectorwise_dequant(i8, s2.to(meta)), ValueError, "stats"),
    ("F vd not a tensor", lambda: F.int8_vectorwise_dequant(i8, [1.0, 1.0]), TypeError, "stats"),
    ("F vd stats length", lambda: F.int8_vectorwise_dequant(i8, s3), ValueError, "stats"),
    # int8_linear_matmul (+ .out)
    ("mm dtype A", lambda: ops.int8_linear_matmul(f16, i8), TypeError, "A"),
    ("mm dtype B", lambda: ops.int8_linear_matmul(i8, i32), TypeError, "B"),
    ("mm device", lambda: ops.int8_linear_matmul(i8, i8.to(meta)), ValueError, "B"),
    ("mm inner dim", lambda: ops.int8_linear_matmul(i8, torch.ones(3, 2, dtype=torch.int8)), ValueError, "B"),
    ("mm B not 2-D", lambda: ops.int8_linear_matmul(i8, torch.ones(3, dtype=torch.int8)), ValueError, "B"),
    ("out dtype", lambda: ops.int8_linear_matmul.out(i8, i8, torch.empty(2, 2)), TypeError, "out"),
    ("out shape", lambda: ops.int8_linear_matmul.out(i8, i8, torch.empty(2, 3, dtype=torch.int32)), ValueError, "out"),
    (
        "out device",
        lambda: ops.int8_linear_matmul.out(i8, i8, torch.empty(2, 2, dtype=torch.int32, device=meta)),
        ValueError,
        "out",
    ),
    (
        "out non-contiguous",
        lambda: ops.int8_linear_matmul.out(i8, i8, torch.empty(2, 2, dtype=torch.int32).t()),
        ValueError,
        "out",
    ),
    ("F mm dtype arg", lambda: F.int8_linear_matmul(i8, i8, dtype=torch.float16), TypeError, "dtype"),
    ("F mm not a tensor", lambda: F.int8_linear_matmul(i8, [[1]]), TypeError, "B"),
    (
        "F mm out shape",
        lambda: F.int8_linear_matmul(i8, i8, out=torch.empty(3, 3, dtype=torch.int32)),
        ValueError,
        "out",
    ),
    # int8_mm_dequant
    ("dq dtype A", lambda: ops.int8_mm_dequant(i8, s2, s3), TypeError, "A"),
    ("dq dtype row", lambda: ops.int8_mm_dequant(i32, s2.double(), s3), TypeError, "row_stats"),
    ("dq dtype col", lambda: ops.int8_mm_dequant(i32, s2, s3.half()), TypeError, "col_stats"),
    ("dq row length", lambda: ops.int8_mm_dequant(i32, s3, s3), ValueError, "row_stats"),
    ("dq col length", lambda: ops.int8_mm_dequant(i32, s2, s2), ValueError, "col_stats"),
    ("dq device", lambda: ops.int8_mm_dequant(i32, s2, s3.to(meta)), ValueError, "col_stats"),
    ("dq out dtype arg", lambda: ops.int8_mm_dequant(i32, s2, s3, dtype=torch.int8), TypeError, "dtype"),
    ("dq bias length", lambda: ops.int8_mm_dequant(i32, s2, s3, bias=s2), ValueError, "bias"),
    ("dq bias dtype", lambda: ops.int8_mm_dequant(i32, s2, s3, bias=s3.int()), TypeError, "bias"),
    ("F dq out shape", lambda: F.int8_mm_dequant(i32, s2, s3, out=torch.empty(3, 2)), ValueError, "out"),
    ("F dq out dtype", lambda: F.int8_mm_dequant(i32, s2, s3, out=i32.clone()), TypeError, "out"),
    ("F dq out device", lambda: F.int8_mm_dequant(i32, s2, s3, out=torch.empty(2, 3, device=meta)), ValueError, "out"),
    ("F dq not a tensor", lambda: F.int8_mm_dequant([[1]], s2, s3), TypeError, "A"),
    # int8_scaled_mm
    ("smm dtype A", lambda: ops.int8_scaled_mm(f16, i8, s2, s2), TypeError, "A"),
    ("smm col length", lambda: ops.int8_scaled_mm(i8, i8, s2, s3), ValueError, "col_stats"),
    ("smm row device", lambda: ops.int8_scaled_mm(i8, i8, s2.to(meta), s2), ValueError, "row_stats"),
    ("smm dtype arg", lambda: ops.int8_scaled_mm(i8, i8, s2, s2, dtype=torch.int32), TypeError, "dtype"),
    # int8_mixed_scaled_mm
    ("mix dtype A", lambda: ops.int8_mixed_scaled_mm(i8, i8, i8, s2, s2), TypeError, "A"),
    ("mix dtype CA", lambda: ops.int8_mixed_scaled_mm(f16, f16, i8, s2, s2), TypeError, "CA"),
    ("mix dtype CB", lambda: ops.int8_mixed_scaled_mm(f16, i8, f16, s2, s2), TypeError, "CB"),
    ("mix shape A", lambda: ops.int8_mixed_scaled_mm(f16[:1], i8, i8, s2, s2), ValueError, "CA"),
    ("mix SCB length", lambda: ops.int8_mixed_scaled_mm(f16, i8, i8, s2, s3), ValueError, "SCB"),
    ("mix cols dtype", lambda: ops.int8_mixed_scaled_mm(f16, i8, i8, s2, s2, s2), TypeError, "outlier_cols"),
    (
        "mix cols device",
        lambda: ops.int8_mixed_scaled_mm(f16, i8, i8, s2, s2, torch.zeros(1, dtype=torch.int64, device=meta)),
        ValueError,
        "outlier_cols",
    ),
    ("mix bias length", lambda: ops.int8_mixed_scaled_mm(f16, i8, i8, s2, s2, None, s3), ValueError, "bias"),
    # int8_double_quant
    ("dbl dtype", lambda: ops.int8_double_quant(i8), TypeError, "A"),
    ("dbl threshold", lambda: ops.int8_double_quant(f16, -0.5), ValueError, "threshold"),
    ("F dbl row_stats", lambda: F.int8_double_quant(f16, row_stats=s2), ValueError, "row_stats"),
    ("F dbl col_stats", lambda: F.int8_double_quant(f16, col_stats=s3), ValueError, "col_stats"),
    ("F dbl out_col", lambda: F.int8_double_quant(f16, out_col=i8), ValueError, "out_col"),
    ("F dbl out_row", lambda: F.int8_double_quant(f16, out_row=i8), ValueError, "out_row"),
    ("F dbl not a tensor", lambda: F.int8_double_quant(1.0), TypeError, "A"),
]


@pytest.mark.parametrize("case,call,exc,arg", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_bad_input_names_the_argument(case, call, exc, arg):
    with pytest.raises(exc, match=rf"\b{arg}\b"):
        call()
