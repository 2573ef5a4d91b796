"""LLM.int8(): row/column-wise int8 quantization, the int8 GEMM and its dequantization.

Bit-exact against the reference: int8 codes, row/column stats, outlier column indices, int32 GEMM
results, and ``subA`` of ``int8_mixed_scaled_mm`` (a gather of A).

Tolerances:
- ``int8_vectorwise_dequant`` (fp32 out): 2 ulp of fp32 (rtol 2**-22). It is ``code * stat / 127``;
  a kernel may fuse the two scalings into one multiplier, which rounds differently in the last bit.
- ``int8_mm_dequant`` / ``int8_scaled_mm``: ``rtol = eps(dtype) + 2**-22`` plus, with a bias,
  ``atol = eps(dtype) * |bias|``. The value ``acc * row * col * c`` (+ bias) is a chain of fp32
  products whose order a kernel may choose (2 fp32 ulp), rounded once to the output dtype (1 ulp of
  it: for fp16 output that rounding can go either way after a last-bit fp32 difference).
- ``int8_mixed_scaled_mm``: as above plus the floating-point outlier product ``subA @ subB.T``,
  summed in any order: ``+ eps(dtype) * 2 * (|subA| @ |subB|.T)``.
"""

from __future__ import annotations

import pytest
import torch

from bitsandbytes._reference import REFERENCE

from ..cases import DTYPES, NONFINITE, dtype_id, randn, seed_of, to
from ..compare import assert_all, assert_close, assert_equal
from ..samples import op_overload

OPS_TESTED = (
    "int8_vectorwise_quant",
    "int8_vectorwise_dequant",
    "int8_linear_matmul",
    "int8_linear_matmul.out",
    "int8_mm_dequant",
    "int8_scaled_mm",
    "int8_mixed_scaled_mm",
    "int8_double_quant",
)

SHAPES = [(1, 7), (5, 40), (2, 3, 33), (16, 129)]
THRESHOLDS = [0.0, 3.0]
F32_ULP2 = 2.0**-22


def both(op, *args, device, **kwargs):
    """(result on the device under test, reference result on CPU copies)."""
    return op_overload(op)(*to(args, device), **to(kwargs, device)), REFERENCE[op](
        *to(args, "cpu"), **to(kwargs, "cpu")
    )


def assert_same_outputs(out, ref, names):
    for o, r, name in zip(out, ref, names, strict=True):
        assert_equal(o, r, f"{name} vs reference")


@pytest.mark.parametrize("threshold", THRESHOLDS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_vectorwise_quant(bnb_device, dtype, shape, threshold):
    A = randn(shape, dtype, seed_of("vq", dtype, shape), spread=False)
    if threshold:
        A.view(-1, shape[-1])[0, -1] = 4.0  # at least one outlier column
    original = A.clone()
    out, ref = both("int8_vectorwise_quant", A, threshold, device=bnb_device)
    assert_same_outputs(out, ref, ("codes", "row stats", "outlier columns"))
    assert_equal(A, original, "the input must not be modified")
    codes, stats, cols = (t.cpu() if t is not None else None for t in out)
    # Reference-free: range, exact row absmax over the inliers, rounding within half a step.
    assert codes.dtype == torch.int8 and tuple(codes.shape) == shape
    assert_all((codes >= -127) & (codes <= 127), "codes within [-127, 127]", codes)
    A2 = A.double().reshape(-1, shape[-1])
    outlier = A2.abs() >= threshold if threshold else torch.zeros_like(A2, dtype=torch.bool)
    inliers = A2.masked_fill(outlier, 0)
    assert_equal(stats, inliers.abs().amax(dim=1).float(), "row stats vs max |x| of the row's inliers")
    expected_cols = outlier.any(dim=0).nonzero().view(-1)
    if threshold:
        assert_equal(cols, expected_cols, "outlier columns: every column holding |x| >= threshold")
    else:
        assert cols is None
    exact = inliers * 127 / stats.double().clamp(min=1e-30)[:, None]
    c2 = codes.reshape(-1, shape[-1]).double()
    in_int8_path = torch.ones_like(c2, dtype=torch.bool)
    in_int8_path[:, expected_cols] = False
    assert_all(((c2 - exact).abs() <= 0.5 + 1e-3) | ~in_int8_path, "codes round x * 127 / absmax", c2)
    assert_all((c2 == 0) | in_int8_path, "outlier columns are coded 0", c2)


@pytest.mark.parametrize("threshold", THRESHOLDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_double_quant(bnb_device, dtype, threshold):
    A = randn((9, 70), dtype, seed_of("dq", dtype), spread=False)
    A[2, 5] = -5.0
    out, ref = both("int8_double_quant", A, threshold, device=bnb_device)
    assert_same_outputs(out, ref, ("row codes", "column codes", "row stats", "column stats", "outlier columns"))
    row, col, row_stats, col_stats, _ = (t.cpu() if t is not None else None for t in out)
    # The row side is exactly int8_vectorwise_quant; the column side is the same rule on A's columns.
    vq = op_overload("int8_vectorwise_quant")(A.to(bnb_device), threshold)
    assert_equal(row, vq[0].cpu(), "row codes vs int8_vectorwise_quant")
    assert_equal(row_stats, vq[1].cpu(), "row stats vs int8_vectorwise_quant")
    inliers = A.double().masked_fill(A.double().abs() >= threshold, 0) if threshold else A.double()
    assert_equal(col_stats, inliers.abs().amax(dim=0).float(), "column stats vs max |x| of each column's inliers")
    assert_all((col >= -127) & (col <= 127), "column codes within [-127, 127]", col)
    assert_all((col.double() - inliers * 127 / col_stats.double()).abs() <= 0.5 + 1e-3, "column codes round", col)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_vectorwise_dequant(bnb_device, shape):
    g = torch.Generator().manual_seed(seed_of("vd", shape))
    codes = torch.randint(-127, 128, shape, generator=g, dtype=torch.int8)
    rows = codes.numel() // shape[-1]
    stats = torch.rand(rows, generator=g) * 5
    stats[0] = 0.0
    out, ref = both("int8_vectorwise_dequant", codes, stats, device=bnb_device)
    assert_close(out, ref, "dequantized vs reference", rtol=F32_ULP2, atol=0)
    truth = (codes.double().reshape(rows, -1) * stats.double()[:, None] / 127).reshape(shape).float()
    assert_close(out, truth, "dequantized vs code * stat / 127", rtol=F32_ULP2, atol=0)


@pytest.mark.parametrize(
    ("a_shape", "N", "fill"),
    [((5, 40), 7, None), ((2, 3, 33), 4, None), ((1, 2048), 3, 127), ((3, 1100), 2, -127), ((4, 0), 3, None)],
    ids=["small", "3d", "K2048-max", "K1100-min", "K0"],
)
def test_linear_matmul(bnb_device, a_shape, N, fill):
    g = torch.Generator().manual_seed(seed_of("mm", a_shape))
    K = a_shape[-1]
    if fill is None:
        A = torch.randint(-127, 128, a_shape, generator=g, dtype=torch.int8)
        B = torch.randint(-127, 128, (N, K), generator=g, dtype=torch.int8)
    else:
        # Extreme values: partial sums pass 2**24, where an fp32 accumulation would round.
        A = torch.full(a_shape, fill, dtype=torch.int8)
        B = torch.full((N, K), 127, dtype=torch.int8)
        B[0, -1] = 126
    out, ref = both("int8_linear_matmul", A, B, device=bnb_device)
    assert_equal(out, ref, "int32 result vs reference")
    truth = torch.matmul(A.long(), B.long().T).to(torch.int32)
    assert_equal(out, truth, "int32 result vs exact int64 math")
    buf = torch.full(tuple(out.shape), 12345, dtype=torch.int32, device=bnb_device)
    op_overload("int8_linear_matmul.out")(A.to(bnb_device), B.to(bnb_device), buf)
    assert_equal(buf, out, ".out vs functional")
    ref_buf = torch.empty(tuple(out.shape), dtype=torch.int32)
    REFERENCE["int8_linear_matmul.out"](A, B, ref_buf)
    assert_equal(ref_buf, ref, "reference .out vs functional")


def assert_dequant_close(out, ref, dtype, bias, what):
    eps = torch.finfo(dtype).eps
    atol = 0.0 if bias is None else eps * bias.double().abs().max().item()
    assert_close(out, ref, what, rtol=eps + F32_ULP2, atol=atol)


@pytest.mark.parametrize("bias_dtype", [None, torch.float16, torch.float32], ids=["nobias", "bias16", "bias32"])
@pytest.mark.parametrize("dtype", [None, *DTYPES], ids=["default", *map(dtype_id, DTYPES)])
def test_mm_dequant(bnb_device, dtype, bias_dtype):
    g = torch.Generator().manual_seed(seed_of("md", dtype, bias_dtype))
    acc = torch.randint(-(2**22), 2**22, (2, 5, 9), generator=g, dtype=torch.int32)
    acc[0, 0, 0] = 0
    row, col = torch.rand(10, generator=g) * 3, torch.rand(9, generator=g) * 3
    bias = None if bias_dtype is None else randn((9,), bias_dtype, seed_of("mdb"), spread=False)
    out, ref = both("int8_mm_dequant", acc, row, col, dtype, bias, device=bnb_device)
    out_dtype = dtype or torch.float16
    assert out.dtype == out_dtype
    assert_dequant_close(out, ref, out_dtype, bias, "dequantized vs reference")
    # Reference-free: acc * row * col / 127**2 (upstream's constant 6.200124e-05) (+ bias), rounded once.
    truth = acc.double() * row.double().view(2, 5, 1) * col.double() * 6.200124e-05
    if bias is not None:
        truth = truth + bias.double()
    assert_dequant_close(out, truth.to(out_dtype), out_dtype, bias, "dequantized vs float64 math")


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("dtype", [None, *DTYPES], ids=["default", *map(dtype_id, DTYPES)])
def test_scaled_mm(bnb_device, dtype, bias):
    g = torch.Generator().manual_seed(seed_of("sm", dtype, bias))
    A = torch.randint(-127, 128, (2, 3, 70), generator=g, dtype=torch.int8)
    B = torch.randint(-127, 128, (11, 70), generator=g, dtype=torch.int8)
    row, col = torch.rand(6, generator=g) * 3, torch.rand(11, generator=g) * 3
    b = randn((11,), dtype or torch.float16, seed_of("smb"), spread=False) if bias else None
    out, ref = both("int8_scaled_mm", A, B, row, col, b, dtype, device=bnb_device)
    out_dtype = dtype or torch.float16
    assert out.dtype == out_dtype and tuple(out.shape) == (2, 3, 11)
    assert_dequant_close(out, ref, out_dtype, b, "result vs reference")
    # It is int8_linear_matmul followed by int8_mm_dequant.
    acc = op_overload("int8_linear_matmul")(A.to(bnb_device), B.to(bnb_device))
    two_step = op_overload("int8_mm_dequant")(acc, *to((row, col), bnb_device), dtype, to(b, bnb_device))
    assert_dequant_close(out, two_step, out_dtype, b, "result vs matmul then mm_dequant")


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_mixed_scaled_mm(bnb_device, dtype, bias):
    M, K, N = 6, 48, 9
    A = randn((M, K), dtype, seed_of("mx", dtype), spread=False)
    A[:, 4] *= 20
    A[3, 30] = -25.0
    W = randn((N, K), torch.float32, seed_of("mxw"), spread=False)
    CA, SCA, cols = op_overload("int8_vectorwise_quant")(A.to(bnb_device), 6.0)
    CB, SCB, _ = op_overload("int8_vectorwise_quant")(W.to(bnb_device), 0.0)
    assert cols is not None and cols.numel() >= 2
    b = randn((N,), dtype, seed_of("mxb"), spread=False) if bias else None
    args = (A, CA, CB, SCA, SCB, cols, b)
    (out, subA), (ref, ref_subA) = both("int8_mixed_scaled_mm", *args, device=bnb_device)
    assert_equal(subA, ref_subA, "subA vs reference")
    assert_equal(subA, A[:, cols.cpu()], "subA is A's outlier columns")
    subB = CB.cpu()[:, cols.cpu()].double() * SCB.cpu().double()[:, None] / 127
    eps = torch.finfo(dtype).eps
    outlier_part = 2 * eps * (subA.cpu().double().abs() @ subB.abs().T)
    diff = (out.cpu().double() - ref.double()).abs()
    allowed = (eps + F32_ULP2) * ref.double().abs() + outlier_part + (eps * b.double().abs() if bias else 0)
    assert_all(diff <= allowed, "result vs reference within the stated tolerance", diff)
    # Reference-free: int8 part as float64 math plus the outliers in float64.
    int8_part = (
        CA.cpu().double() @ CB.cpu().double().T * SCA.cpu().double()[:, None] * SCB.cpu().double() * 6.200124e-05
    )
    truth = int8_part + subA.cpu().double() @ subB.T + (b.double() if bias else 0)
    assert_all((out.cpu().double() - truth).abs() <= allowed + eps * truth.abs(), "result vs float64 math", out)


@pytest.mark.parametrize("value", NONFINITE, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_nonfinite_input(bnb_device, dtype, value):
    A = randn((4, 33), dtype, seed_of("nfi", dtype), spread=False)
    A[1, 7] = value
    out, ref = both("int8_vectorwise_quant", A, 0.0, device=bnb_device)
    codes, stats, _ = out
    assert not stats[1].isfinite().item(), "a non-finite value makes its row's scale non-finite"
    assert_close(stats, ref[1], "row stats vs reference", rtol=0, atol=0)
    keep = torch.tensor([True, False, True, True])
    assert_equal(codes.cpu()[keep], ref[0][keep], "codes of the finite rows vs reference")
    deq = op_overload("int8_vectorwise_dequant")(codes, stats).cpu()
    assert_all(~deq[1].isfinite(), "the row dequantizes to non-finite values", deq[1])
    assert_all(deq[keep].isfinite(), "the other rows stay finite", deq)
