"""The blockwise family's CUDA kernels (csrc/kernels/blockwise.cu), run in the emulator against the reference.

Codes, absmax and dequantized values are bytes the formats define, so every comparison is bit-exact
(absmax NaNs included: the kernel writes the quiet NaN torch's amax gives; only the payload of a
dequantized NaN is free). The op functions of ``bitsandbytes_cuda.ops.blockwise`` are called directly on
CPU tensors with ``launch`` in emulator mode. That blockwise.cu builds with nvcc (warnings as errors) is
test_launch.py's library build; the conformance suite runs these ops via bitsandbytes_cuda.testing.emulated.
"""

from __future__ import annotations

import pytest
import torch
from bitexact import check_blockwise, on_midpoints, raises_as_the_reference

from bitsandbytes._reference import REFERENCE
from bitsandbytes.testing.cases import (
    BLOCKSIZES,
    DTYPES,
    NONFINITE,
    blockwise_cases,
    dtype_id,
    empty_shapes,
    randn,
    seed_of,
    with_nonfinite,
    with_zero_block,
)
from bitsandbytes.testing.compare import assert_equal
from bitsandbytes_cuda.ops import blockwise

CASES = list(blockwise_cases())
CASE_IDS = [f"{dtype_id(d)}-b{b}-{'x'.join(map(str, s))}" for d, b, s in CASES]


pytestmark = pytest.mark.usefixtures("emulated")  # conftest: launch() in the emulator


@pytest.mark.parametrize(("dtype", "blocksize", "shape"), CASES, ids=CASE_IDS)
def test_blockwise_matches_reference(code, dtype, blocksize, shape):
    check_blockwise(randn(shape, dtype, seed_of("q8", dtype, blocksize, shape)), code, blocksize)


@pytest.mark.parametrize("out_dtype", DTYPES, ids=dtype_id)
def test_blockwise_dequantize_to_other_dtypes_and_out(code, out_dtype):
    A = randn((3 * 64 + 5,), torch.float32, seed_of("q8o", out_dtype))
    q, absmax = blockwise.quantize_blockwise(A, code, 64)
    ref = REFERENCE["dequantize_blockwise"](q, absmax, code, 64, out_dtype)
    assert_equal(blockwise.dequantize_blockwise(q, absmax, code, 64, out_dtype), ref, "dequantized")
    out = torch.full(A.shape, float("nan"), dtype=out_dtype)
    assert blockwise.dequantize_blockwise_out(q, absmax, code, 64, out_dtype, out) is None
    assert_equal(out, ref, "dequantized into out")


def test_blockwise_ties_go_to_the_lower_neighbour(code):
    """Values exactly on the float32 midpoints (the block's absmax is 1, so they scale to themselves)."""
    by_value = code.sort().values
    mids = (by_value[:-1] + by_value[1:]) / 2
    A = torch.cat([torch.ones(1), mids, -mids, by_value, torch.zeros(1), -torch.zeros(1)])
    A = torch.cat([A, torch.zeros(-A.numel() % 256)])
    A[::256] = 1.0
    check_blockwise(A, code, 256)


def test_blockwise_full_blocks_multiply_the_last_block_divides(code):
    by_value = code.sort().values
    check_blockwise(on_midpoints((by_value[:-1] + by_value[1:]) / 2, 256, 7.0), code, 256)


def test_blockwise_unsorted_map_with_duplicates(code):
    """quant_map_prepare sorts the map stably: any order, equal entries go to the lowest index."""
    g = torch.Generator().manual_seed(7)
    shuffled = code[torch.randperm(256, generator=g)].clone()
    shuffled[10] = shuffled[200]  # a duplicated value
    shuffled[3] = -0.0
    A = randn((5 * 128 + 9,), torch.float32, seed_of("unsorted"))
    check_blockwise(A, shuffled, 128)


def test_prepared_map_is_the_reference_sort(code):
    g = torch.Generator().manual_seed(3)
    shuffled = code[torch.randperm(256, generator=g)]
    mids, order = blockwise.sorted_code_map(shuffled)
    idx = torch.argsort(shuffled, stable=True)
    assert_equal(order, idx.to(torch.uint8), "order")
    v = shuffled[idx]
    assert_equal(mids[:255], (v[:-1] + v[1:]) / 2, "midpoints")


@pytest.mark.parametrize("value", NONFINITE, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_blockwise_nonfinite(code, dtype, value):
    A = with_nonfinite(randn((3 * 64 + 5,), dtype, seed_of("nf8", dtype, value)), 64, value)
    A = with_nonfinite(A, 64, value, block=3, offset=2)  # and one in the short last block
    check_blockwise(A, code, 64)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_blockwise_all_zero_block(code, dtype):
    check_blockwise(with_zero_block(randn((3 * 64 + 5,), dtype, seed_of("z8", dtype)), 64), code, 64)


@pytest.mark.parametrize("shape", empty_shapes(), ids=str)
def test_blockwise_empty(code, shape):
    check_blockwise(torch.empty(shape), code, 64)


def test_geometry_meets_the_kernels_requirements():
    for n in (1, 1000, 10**9):
        for blocksize in BLOCKSIZES:
            grid, threads = blockwise.quantize_geometry(n, blocksize)
            group = blocksize // blockwise.ITEMS_PER_THREAD
            assert threads % 32 == 0 and threads % group == 0 and 256 <= threads <= 1024
            assert 1 <= grid <= blockwise.MAX_GRID
        grid, threads = blockwise.dequantize_geometry(n)
        assert 1 <= grid <= blockwise.MAX_GRID and threads == blockwise.THREADS


@pytest.mark.parametrize(
    ("op", "args"),
    [
        ("quantize_blockwise", lambda c: (torch.zeros(8), c, 0)),  # any positive size is valid
        ("quantize_blockwise", lambda c: (torch.zeros(8, dtype=torch.int32), c, 64)),
        ("quantize_blockwise", lambda c: (torch.zeros(8), c[:100], 64)),
        ("dequantize_blockwise", lambda c: (torch.zeros(8, dtype=torch.uint8), torch.zeros(2), c, 64, torch.float32)),
    ],
    ids=["blocksize", "A-dtype", "code-numel", "absmax-numel"],
)
def test_errors_are_the_references(code, op, args):
    raises_as_the_reference(op, getattr(blockwise, op), args(code))
