"""The entry points that take sizes as integers next to their arrays (gemv_4bit's M, N, K and
dequantize_4bit_range's i0, i1) refuse sizes whose products or sums overflow int64, instead of wrapping
to a small count that passes the array checks (found by ci/fuzz/fuzz_native_matmul_4bit.py)."""

from __future__ import annotations

import pytest
import torch

from bitsandbytes_cpu import _C

BIG = 2**62
MAX = 2**63 - 1


def _gemv(M, N, K):
    empty = torch.empty(0)
    code = torch.ones(16)
    _C.gemv_4bit(empty, torch.empty(0, dtype=torch.uint8), M, N, K, empty, code, 64, None, torch.empty(0), 1)


@pytest.mark.parametrize(
    ("M", "N", "K", "what"),
    [
        (2**32, 0, 2**32, "M \\* K"),  # wraps to 0: every array empty, yet M rows to compute
        (BIG, 0, 4, "M \\* K"),
        (0, BIG, 4, "N \\* K"),
        (2**33, 2**31, 0, "M \\* N"),
        (3, 3, MAX, "M \\* K"),  # wraps negative: the element-count checks took a negative count as "any"
    ],
)
def test_gemv_4bit_size_products_that_overflow_are_refused(M, N, K, what):
    with pytest.raises(ValueError, match=f"{what} overflows int64"):
        _gemv(M, N, K)


def test_gemv_4bit_still_runs_empty_products():
    _gemv(0, 0, 0)
    _gemv(5, 0, 0)  # no weights: nothing to compute, nothing read


@pytest.mark.parametrize(("i0", "i1"), [(MAX - 9, MAX), (MAX - 64, MAX - 1), (0, MAX)])
def test_dequantize_4bit_range_past_int64_is_refused(i0, i1):
    B = torch.zeros(8, dtype=torch.uint8)
    out = torch.empty(min(i1 - i0, 16))
    with pytest.raises(ValueError, match="B holds 8 bytes"):
        _C.dequantize_4bit_range(B, torch.ones(1), torch.ones(16), 64, i0, i1, out, 1)


def test_dequantize_4bit_range_still_reads_the_last_byte():
    B = torch.full((8,), 0x77, dtype=torch.uint8)
    out = torch.empty(1)
    _C.dequantize_4bit_range(B, torch.ones(1), torch.arange(16.0), 64, 15, 16, out, 1)
    assert out.item() == 7.0
