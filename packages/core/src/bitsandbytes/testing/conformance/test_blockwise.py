"""8-bit blockwise quantization with a 256-entry code table (the dynamic map).

Bit-exact against the reference: codes, absmax, and dequantized values (one fp32 product
``code[q] * absmax`` rounded once to the output dtype). No tolerances in this module.
"""

from __future__ import annotations

import pytest
import torch

from bitsandbytes import functional
from bitsandbytes._reference import REFERENCE

from ..cases import (
    BLOCKSIZES,
    DTYPES,
    NONFINITE,
    block_absmax,
    blockwise_cases,
    dtype_id,
    empty_shapes,
    on_midpoints,
    randn,
    seed_of,
    to,
    with_nonfinite,
    with_zero_block,
)
from ..compare import assert_all, assert_close, assert_equal, assert_equal_up_to_nan_payload
from ..samples import op_overload

OPS_TESTED = ("quantize_blockwise", "dequantize_blockwise", "dequantize_blockwise.out")

CASES = list(blockwise_cases())
CASE_IDS = [f"{dtype_id(d)}-b{b}-{'x'.join(map(str, s))}" for d, b, s in CASES]


@pytest.fixture(scope="module")
def code() -> torch.Tensor:
    return functional.create_dynamic_map(signed=True).float()


def quantize(A, code, blocksize, device):
    q, absmax = op_overload("quantize_blockwise")(*to((A, code), device), blocksize)
    rq, rabsmax = REFERENCE["quantize_blockwise"](*to((A, code), "cpu"), blocksize)
    return q, absmax, rq, rabsmax


def dequantize(q, absmax, code, blocksize, dtype, device):
    out = op_overload("dequantize_blockwise")(*to((q, absmax, code), device), blocksize, dtype)
    ref = REFERENCE["dequantize_blockwise"](*to((q, absmax, code), "cpu"), blocksize, dtype)
    return out, ref


def assert_nearest_codes(A: torch.Tensor, q: torch.Tensor, code: torch.Tensor, blocksize: int) -> None:
    """Each code is a nearest table entry to ``x / absmax`` (a reference-free check of the rounding)."""
    absmax = block_absmax(A, blocksize)
    n = A.numel()
    scale = absmax.repeat_interleave(blocksize)[:n]
    scaled = torch.where(scale > 0, A.detach().cpu().double().reshape(-1) / scale, 0.0)
    dist = (scaled[:, None] - code.double()[None, :]).abs()
    chosen = dist.gather(1, q.cpu().reshape(-1, 1).long()).squeeze(1)
    # The kernel scales in fp32, so a value within a few fp32 ulps of a midpoint may take either side.
    assert_all(chosen <= dist.min(dim=1).values + 2e-7, "codes must be a nearest entry of the code table", chosen)


@pytest.mark.parametrize(("dtype", "blocksize", "shape"), CASES, ids=CASE_IDS)
def test_quantize(bnb_device, code, dtype, blocksize, shape):
    A = randn(shape, dtype, seed_of("qb", dtype, blocksize, shape))
    q, absmax, rq, rabsmax = quantize(A, code, blocksize, bnb_device)
    assert_equal(q, rq, "codes vs reference")
    assert_equal(absmax, rabsmax, "absmax vs reference")
    # Reference-free: the shapes, absmax = exact max |x| per block, and nearest-code rounding.
    assert tuple(q.shape) == tuple(shape) and q.dtype == torch.uint8
    assert_equal(absmax, block_absmax(A, blocksize).float(), "absmax vs max |x| of each block")
    assert_nearest_codes(A, q, code, blocksize)
    # Round trip error is at most half the widest gap of the table, times the block's absmax. The
    # signed dynamic map has no -1.0, so the stretch from -1 to its lowest entry counts as a gap too.
    c64 = code.double()
    half_gap = max((c64.diff().max() / 2).item(), 1 - c64.max().item(), c64.min().item() + 1)
    dq, _ = dequantize(q, absmax, code, blocksize, torch.float32, bnb_device)
    err = (dq.cpu().double() - A.double()).abs().reshape(-1)
    # (plus the fp32 rounding of the product code * absmax, at most 2**-24 of absmax)
    bound = block_absmax(A, blocksize).repeat_interleave(blocksize)[: A.numel()] * (half_gap + 2**-22)
    assert_all(err <= bound, "round trip error within half a code gap times absmax", err)


@pytest.mark.parametrize("blocksize", BLOCKSIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_dequantize(bnb_device, code, dtype, blocksize):
    g = torch.Generator().manual_seed(seed_of("db", dtype, blocksize))
    n = 3 * blocksize + 7
    q = torch.randint(0, 256, (n,), generator=g, dtype=torch.uint8)
    absmax = torch.rand(4, generator=g) * 10
    absmax[1] = 0.0
    out, ref = dequantize(q, absmax, code, blocksize, dtype, bnb_device)
    assert_equal(out, ref, "dequantized values vs reference")
    # Reference-free: one fp32 product per value, rounded once to dtype.
    expected = (code[q.long()] * absmax.repeat_interleave(blocksize)[:n]).to(dtype)
    assert_equal(out, expected, "dequantized values vs code[q] * absmax")

    # The .out overload writes the same values, over whatever out held before.
    buf = torch.full((n,), float("nan"), dtype=dtype, device=bnb_device)
    op_overload("dequantize_blockwise.out")(*to((q, absmax, code), bnb_device), blocksize, dtype, buf)
    assert_equal(buf, out, ".out vs functional")
    ref_buf = torch.empty(n, dtype=dtype)
    REFERENCE["dequantize_blockwise.out"](q, absmax, code, blocksize, dtype, ref_buf)
    assert_equal(ref_buf, ref, "reference .out vs reference functional")


# Upstream's CPU path takes any positive block size (its tests use 16384). A backend whose kernels
# cover only BLOCKSIZES hands the others to the reference kernel, so every device gives the same bytes.
OFF_GRID_BLOCKSIZES = (48, 100, 8192, 16384, 65536)


@pytest.mark.parametrize("blocksize", OFF_GRID_BLOCKSIZES)
def test_any_positive_blocksize(bnb_device, code, blocksize):
    A = randn((blocksize + 3,), torch.float32, seed_of("anyb", blocksize))  # a full block and a short one
    q, absmax, rq, rabsmax = quantize(A, code, blocksize, bnb_device)
    assert_equal(q, rq, "codes vs reference")
    assert_equal(absmax, rabsmax, "absmax vs reference")
    assert_equal(absmax, block_absmax(A, blocksize).float(), "absmax vs max |x| of each block")
    for dtype in DTYPES:
        out, ref = dequantize(q, absmax, code, blocksize, dtype, bnb_device)
        assert_equal(out, ref, "dequantized values vs reference")
        buf = torch.full(A.shape, float("nan"), dtype=dtype, device=bnb_device)
        op_overload("dequantize_blockwise.out")(*to((q, absmax, code), bnb_device), blocksize, dtype, buf)
        assert_equal(buf, out, ".out vs functional")


def test_ties_go_to_the_lower_index(bnb_device, code):
    # Values exactly halfway between two neighbouring codes, in a block whose absmax is exactly 1.
    c64 = code.double()
    mids = (c64[:-1] + c64[1:]) / 2
    exact = (mids.float().double() == mids).nonzero().view(-1)
    exact = exact[(c64[exact] != c64[exact + 1])]
    assert exact.numel() > 10, "the dynamic map should have many fp32-representable midpoints"
    A = torch.cat([torch.ones(1), mids[exact].float()])
    q, _, rq, _ = quantize(A, code, 4096, bnb_device)
    assert_equal(q, rq, "codes vs reference")
    expected = torch.cat([torch.tensor([255]), exact]).to(torch.uint8)
    assert_equal(q.cpu(), expected, "a tie between two codes goes to the lower index")


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_all_zero_block(bnb_device, code, dtype):
    blocksize = 64
    A = with_zero_block(randn((3 * blocksize + 5,), dtype, seed_of("zb", dtype)), blocksize, block=1)
    q, absmax, rq, rabsmax = quantize(A, code, blocksize, bnb_device)
    assert_equal(q, rq, "codes vs reference")
    assert_equal(absmax, rabsmax, "absmax vs reference")
    assert absmax[1].item() == 0.0
    out, _ = dequantize(q, absmax, code, blocksize, dtype, bnb_device)
    assert_all(out.isfinite(), "no NaN/Inf anywhere", out)
    assert_all(out[blocksize : 2 * blocksize] == 0, "an all-zero block dequantizes to zeros", out)
    everything_zero = torch.zeros(2 * blocksize + 1, dtype=dtype)
    q, absmax, _, _ = quantize(everything_zero, code, blocksize, bnb_device)
    out, _ = dequantize(q, absmax, code, blocksize, dtype, bnb_device)
    assert_equal(absmax.cpu(), torch.zeros(3), "absmax of zero blocks")
    assert_equal(out.cpu(), everything_zero, "zeros round trip")


@pytest.mark.parametrize("shape", empty_shapes(), ids=str)
def test_empty(bnb_device, code, shape):
    A = torch.empty(shape, dtype=torch.float16)
    q, absmax, rq, rabsmax = quantize(A, code, 64, bnb_device)
    assert_equal(q, rq, "codes vs reference")
    assert_equal(absmax, rabsmax, "absmax vs reference")
    assert tuple(q.shape) == shape and absmax.numel() == 0
    out, ref = dequantize(q, absmax, code, 64, torch.bfloat16, bnb_device)
    assert_equal(out, ref, "dequantized vs reference")


@pytest.mark.parametrize("value", NONFINITE, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_nonfinite_input(bnb_device, code, dtype, value):
    blocksize = 64
    A = with_nonfinite(randn((3 * blocksize + 5,), dtype, seed_of("nf", dtype, value)), blocksize, value)
    q, absmax, rq, rabsmax = quantize(A, code, blocksize, bnb_device)
    assert not absmax[1].isfinite().item(), "a non-finite value makes its block's absmax non-finite"
    assert_close(absmax, rabsmax, "absmax vs reference", rtol=0, atol=0)
    bad = slice(blocksize, 2 * blocksize)
    keep = torch.ones(A.numel(), dtype=torch.bool)
    keep[bad] = False
    # The codes inside the poisoned block are not defined by the format; those outside are.
    assert_equal(q.cpu()[keep], rq[keep], "codes of the finite blocks vs reference")
    out, _ = dequantize(q, absmax, code, blocksize, dtype, bnb_device)
    assert_all(~out[bad].isfinite(), "the block dequantizes to non-finite values", out[bad])
    assert_all(out[keep.to(out.device)].isfinite(), "the other blocks stay finite", out)


# Edge cases of the nearest-code search and of the scaling rules (the backends' kernels once differed on
# each): every result is compared with the reference's bytes; only a NaN's payload is free.


def check_blockwise(A, code, blocksize, device):
    q, absmax, rq, rabsmax = quantize(A, code, blocksize, device)
    assert_equal(q, rq, "codes vs reference")
    assert_equal_up_to_nan_payload(absmax, rabsmax, "absmax vs reference")
    out, ref = dequantize(q, absmax, code, blocksize, A.dtype, device)
    assert_equal_up_to_nan_payload(out, ref, "dequantized values vs reference")


def test_full_blocks_multiply_the_last_block_divides(bnb_device, code):
    by_value = code.sort().values
    check_blockwise(on_midpoints((by_value[:-1] + by_value[1:]) / 2, 256, 7.0), code, 256, bnb_device)


def test_unsorted_map_with_duplicates(bnb_device, code):
    """The map is searched in its stable sort: any order, equal entries go to the lowest index."""
    g = torch.Generator().manual_seed(7)
    shuffled = code[torch.randperm(256, generator=g)].clone()
    shuffled[10] = shuffled[200]  # a duplicated value
    shuffled[3] = -0.0
    check_blockwise(randn((5 * 128 + 9,), torch.float32, seed_of("unsorted")), shuffled, 128, bnb_device)


def test_unsigned_and_linear_maps(bnb_device):
    A = randn((2 * 64 + 3,), torch.float16, seed_of("maps"))
    check_blockwise(A.abs(), functional.create_dynamic_map(signed=False).float(), 64, bnb_device)
    check_blockwise(A, torch.linspace(-1, 1, 256), 64, bnb_device)


@pytest.mark.parametrize("nan_at", [0, 5, 200, 255])
def test_map_with_a_nan_entry(bnb_device, code, nan_at):
    """A NaN map entry sorts after every number, and the midpoints next to it are searched as the
    reference's bucketize searches them (it goes right at a NaN boundary)."""
    with_nan = code.clone()
    with_nan[nan_at] = float("nan")
    A = randn((16 * 256 + 77,), torch.float32, seed_of("nan map", nan_at))
    A[7] = float("nan")
    check_blockwise(A, with_nan, 256, bnb_device)


@pytest.mark.parametrize("value", NONFINITE, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_nonfinite_in_the_short_last_block(bnb_device, code, dtype, value):
    A = with_nonfinite(randn((3 * 64 + 5,), dtype, seed_of("nf8", dtype, value)), 64, value)
    check_blockwise(with_nonfinite(A, 64, value, block=3, offset=2), code, 64, bnb_device)
