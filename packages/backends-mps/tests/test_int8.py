"""The int8 Metal kernels in emulation against the reference: codes, stats and outlier columns byte for
byte, dequantized values exactly (both compute the same fp32 operations in the same order)."""

from __future__ import annotations

import pytest
import torch

from bitsandbytes._reference import int8 as reference
from bitsandbytes_mps.ops import int8 as mps

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _same(got, want):
    if want is None:
        assert got is None
        return
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


CASES = [((3, 5), 0.0), ((4, 300), 0.0), ((2, 3, 33), 2.5), ((7, 64), 3.0), ((45,), 1.0)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("shape", "threshold"), CASES)
def test_vectorwise_quant_matches_reference(emulated, dtype, shape, threshold):
    g = torch.Generator().manual_seed(sum(shape))
    A = (torch.randn(shape, generator=g) * 1.5).to(dtype)
    got = mps.int8_vectorwise_quant(A, threshold)
    want = reference.int8_vectorwise_quant(A, threshold)
    for a, b in zip(got, want, strict=True):
        _same(a, b)
    if threshold:
        assert got[2].numel() > 0  # the case does exercise outlier columns


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_vectorwise_quant_special_rows(emulated, dtype):
    A = torch.randn(6, 40).to(dtype)
    A[0] = 0  # zero row: codes 0, stat 0
    A[1, 7] = float("nan")  # NaN row: stat NaN, codes 0
    A[2, 3] = float("inf")  # an outlier under a threshold; +inf absmax without one
    A[3, 5] = 1e-40 if dtype == torch.float32 else 0  # a subnormal in an otherwise tiny row
    A[3] = A[3] * 1e-30 if dtype == torch.float32 else A[3]
    A[4, 0] = 4.0  # exactly at the threshold: an outlier
    if dtype == torch.float32:  # a subnormal absmax: 127 / absmax overflows, codes are 0 (zeros) and +-127
        A[5] = torch.linspace(-1, 1, 40) * 2e-39
        A[5, ::3] = 0.0
    for threshold in (0.0, 4.0):
        got = mps.int8_vectorwise_quant(A, threshold)
        want = reference.int8_vectorwise_quant(A, threshold)
        for a, b in zip(got, want, strict=True):
            _same(a, b)


def test_vectorwise_quant_ties_round_to_even(emulated):
    # absmax 127 makes the scale exactly 1: x.5 values are ties, rounded to even as torch.round does.
    A = torch.tensor([[127.0, 0.5, 1.5, 2.5, -0.5, -1.5, 126.5]])
    codes, _, _ = mps.int8_vectorwise_quant(A)
    assert codes.tolist() == [[127, 0, 2, 2, 0, -2, 126]]
    _same(codes, reference.int8_vectorwise_quant(A)[0])


# (700, 5): narrow rows stacked 51 to a group, the last group short in y; (3, 300): a short group in x.
@pytest.mark.parametrize("shape", [(1, 1), (5, 37), (2, 3, 20), (700, 5), (3, 300)])
def test_vectorwise_dequant_matches_reference(emulated, shape):
    A = torch.randint(-127, 128, shape, dtype=torch.int8)
    stats = torch.rand(A.numel() // shape[-1]) * 10
    _same(mps.int8_vectorwise_dequant(A, stats), reference.int8_vectorwise_dequant(A, stats))


@pytest.mark.parametrize("dtype", [None, *DTYPES], ids=str)
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("shape", [(9, 33), (600, 3), (2, 513)])
def test_mm_dequant_matches_reference(emulated, dtype, with_bias, shape):
    A = torch.randint(-(2**20), 2**20, shape, dtype=torch.int32)
    rows, cols = torch.rand(shape[0]) * 5, torch.rand(shape[1]) * 5
    bias = torch.randn(shape[1]).to(dtype or torch.float16) if with_bias else None
    got = mps.int8_mm_dequant(A, rows, cols, dtype=dtype, bias=bias)
    _same(got, reference.int8_mm_dequant(A, rows, cols, dtype=dtype, bias=bias))


def test_empty_inputs_take_the_reference(emulated):
    A = torch.empty(0, 8)
    for a, b in zip(mps.int8_vectorwise_quant(A, 1.0), reference.int8_vectorwise_quant(A, 1.0), strict=True):
        _same(a, b)
    _same(mps.int8_vectorwise_dequant(torch.empty(0, 4, dtype=torch.int8), torch.empty(0)),
          torch.empty(0, 4))  # fmt: skip


def test_bad_arguments_raise_the_core_errors(emulated):
    with pytest.raises(TypeError, match="A"):
        mps.int8_vectorwise_quant(torch.ones(2, 2, dtype=torch.int32))
    with pytest.raises((TypeError, ValueError), match="stats"):
        mps.int8_vectorwise_dequant(torch.ones(2, 2, dtype=torch.int8), torch.ones(3))


@pytest.mark.parametrize("op", ["vectorwise", "mm"])
def test_dequant_launches_stay_within_32_bit_indices(emulated, monkeypatch, op):
    """The dequantizers index with 32 bits: a matrix of more elements than the launch limit goes to the
    reference (here with the limit lowered to 50 elements), one within it to the kernel."""
    from bitsandbytes_mps.ops import _common

    launched = []
    real = mps.dispatch
    monkeypatch.setattr(mps, "dispatch", lambda name, *a, **k: launched.append(name) or real(name, *a, **k))
    monkeypatch.setattr(_common, "MAX_THREADS", 50)
    for rows, cols, native in ((8, 6, True), (10, 6, False)):
        launched.clear()
        if op == "vectorwise":
            A, stats = torch.randint(-127, 128, (rows, cols), dtype=torch.int8), torch.rand(rows)
            _same(mps.int8_vectorwise_dequant(A, stats), reference.int8_vectorwise_dequant(A, stats))
        else:
            A, rs, cs = torch.randint(-999, 999, (rows, cols), dtype=torch.int32), torch.rand(rows), torch.rand(cols)
            _same(mps.int8_mm_dequant(A, rs, cs), reference.int8_mm_dequant(A, rs, cs))
        assert bool(launched) == native, (rows, cols, launched)
