"""The quant family's CUDA kernels (csrc/kernels/quant.cu), run in the emulator against the reference.

Codes, absmax and dequantized values are bytes the formats define, so every comparison is bit-exact
(absmax NaNs included: the kernel writes the quiet NaN torch's amax gives; only the payload of a
dequantized NaN is free). The op functions of ``bitsandbytes_cuda.ops.quant`` are called directly on
CPU tensors with ``launch`` in emulator mode. That quant.cu builds with nvcc (warnings as errors) is
test_launch.py's library build; the conformance suite runs these ops via bitsandbytes_cuda.testing.emulated.
"""

from __future__ import annotations

import re

import pytest
import torch

import bitsandbytes
from bitsandbytes import functional
from bitsandbytes._reference import REFERENCE
from bitsandbytes.testing.cases import (
    BLOCKSIZES,
    DTYPES,
    NONFINITE,
    QUANT_STORAGE_DTYPES,
    QUANT_TYPES,
    blockwise_cases,
    dtype_id,
    empty_shapes,
    randn,
    seed_of,
    with_nonfinite,
    with_zero_block,
)
from bitsandbytes.testing.compare import assert_equal
from bitsandbytes_cuda.ops import quant

CASES = list(blockwise_cases())
CASE_IDS = [f"{dtype_id(d)}-b{b}-{'x'.join(map(str, s))}" for d, b, s in CASES]


pytestmark = pytest.mark.usefixtures("emulated")  # conftest: launch() in the emulator


@pytest.fixture(scope="module")
def code() -> torch.Tensor:
    return functional.create_dynamic_map(signed=True).float()


def same_nans(actual: torch.Tensor, expected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both with every NaN where both have one replaced by 0: NaN payloads are not part of the format (a
    GPU converts NaN to fp16 as 0x7fff, torch on a CPU as 0x7e00), everything else is compared bit for bit."""
    both = actual.isnan() & expected.isnan()
    return actual.masked_fill(both, 0), expected.masked_fill(both, 0)


def check_blockwise(A, code, blocksize, dtype=None):
    """quantize_blockwise and its dequantization (to ``dtype``, default A's) equal the reference's bytes."""
    q, absmax = quant.quantize_blockwise(A, code, blocksize)
    rq, rabsmax = REFERENCE["quantize_blockwise"](A, code, blocksize)
    assert_equal(q, rq, "codes")
    assert_equal(absmax, rabsmax, "absmax")
    dtype = dtype or A.dtype
    out = quant.dequantize_blockwise(q, absmax, code, blocksize, dtype)
    ref = REFERENCE["dequantize_blockwise"](rq, rabsmax, code, blocksize, dtype)
    assert_equal(*same_nans(out, ref), "dequantized")


def check_4bit(A, blocksize, quant_type, dtype=None, storage=torch.uint8):
    """quantize_4bit and its dequantization equal the reference's bytes."""
    packed, absmax = quant.quantize_4bit(A, blocksize, quant_type, storage)
    rpacked, rabsmax = REFERENCE["quantize_4bit"](A, blocksize, quant_type, storage)
    assert_equal(packed, rpacked, "packed codes")
    assert_equal(absmax, rabsmax, "absmax")
    dtype = dtype or A.dtype
    out = quant.dequantize_4bit(packed, absmax, blocksize, quant_type, list(A.shape), dtype)
    ref = REFERENCE["dequantize_4bit"](rpacked, rabsmax, blocksize, quant_type, list(A.shape), dtype)
    assert_equal(*same_nans(out, ref), "dequantized")


# ------------------------------------------------------------------------------------------- 8-bit


@pytest.mark.parametrize(("dtype", "blocksize", "shape"), CASES, ids=CASE_IDS)
def test_blockwise_matches_reference(code, dtype, blocksize, shape):
    check_blockwise(randn(shape, dtype, seed_of("q8", dtype, blocksize, shape)), code, blocksize)


@pytest.mark.parametrize("out_dtype", DTYPES, ids=dtype_id)
def test_blockwise_dequantize_to_other_dtypes_and_out(code, out_dtype):
    A = randn((3 * 64 + 5,), torch.float32, seed_of("q8o", out_dtype))
    q, absmax = quant.quantize_blockwise(A, code, 64)
    ref = REFERENCE["dequantize_blockwise"](q, absmax, code, 64, out_dtype)
    assert_equal(quant.dequantize_blockwise(q, absmax, code, 64, out_dtype), ref, "dequantized")
    out = torch.full(A.shape, float("nan"), dtype=out_dtype)
    assert quant.dequantize_blockwise_out(q, absmax, code, 64, out_dtype, out) is None
    assert_equal(out, ref, "dequantized into out")


def test_blockwise_ties_go_to_the_lower_neighbour(code):
    """Values exactly on the float32 midpoints (the block's absmax is 1, so they scale to themselves)."""
    by_value = code.sort().values
    mids = (by_value[:-1] + by_value[1:]) / 2
    A = torch.cat([torch.ones(1), mids, -mids, by_value, torch.zeros(1), -torch.zeros(1)])
    A = torch.cat([A, torch.zeros(-A.numel() % 256)])
    A[::256] = 1.0
    check_blockwise(A, code, 256)


def on_midpoints(mids: torch.Tensor, blocksize: int, absmax: float) -> torch.Tensor:
    """A full block and a short last block whose values are midpoints times ``absmax``: scaled by the
    full-block rule (multiply by 1 / absmax) or the last-block rule (divide) they land on the midpoint
    (a tie) or one ulp off it, depending on the rule; so each block checks that the kernel uses its rule."""
    block = torch.cat([torch.tensor([absmax]), mids * absmax])
    block = torch.cat([block, torch.zeros(blocksize - block.numel())])
    a = torch.tensor(absmax)
    x = mids * absmax
    multiply, divide = x * (1.0 / a) == mids, x / a == mids
    assert (multiply & ~divide).any() and (divide & ~multiply).any(), "each rule must make ties the other does not"
    return torch.cat([block, block[: mids.numel()]])


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
    mids, order = quant.sorted_code_map(shuffled)
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


# ------------------------------------------------------------------------------------------- 4-bit


@pytest.mark.parametrize("quant_type", QUANT_TYPES)
@pytest.mark.parametrize(("dtype", "blocksize", "shape"), CASES, ids=CASE_IDS)
def test_4bit_matches_reference(dtype, blocksize, shape, quant_type):
    check_4bit(randn(shape, dtype, seed_of("q4", dtype, blocksize, shape, quant_type)), blocksize, quant_type)


@pytest.mark.parametrize("quant_type", QUANT_TYPES)
@pytest.mark.parametrize("out_dtype", DTYPES, ids=dtype_id)
def test_4bit_dequantize_to_other_dtypes_and_out(out_dtype, quant_type):
    A = randn((4, 51), torch.bfloat16, seed_of("q4o", out_dtype, quant_type))
    packed, absmax = quant.quantize_4bit(A, 32, quant_type, torch.uint8)
    ref = REFERENCE["dequantize_4bit"](packed, absmax, 32, quant_type, [4, 51], out_dtype)
    out = torch.full((4, 51), float("nan"), dtype=out_dtype)
    assert quant.dequantize_4bit_out(packed, absmax, 32, quant_type, [4, 51], out_dtype, out) is None
    assert_equal(out, ref, "dequantized into out")


@pytest.mark.parametrize("quant_type", QUANT_TYPES)
def test_4bit_ties_and_signed_zeros(quant_type):
    """Values on every midpoint of the table, +-0 and the smallest values either side of 0 (FP4 splits
    its two zero codes at 0)."""
    table = torch.tensor(bitsandbytes._formats.code_table(quant_type, "cpu").tolist())
    v = table.sort().values
    mids = (v[:-1] + v[1:]) / 2
    tiny = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 2e-3, -2e-3])
    A = torch.cat([torch.ones(1), mids, v, tiny, torch.nextafter(mids, torch.ones(1)), torch.ones(1) * -1])
    check_4bit(A, 64, quant_type)


@pytest.mark.parametrize(("quant_type", "absmax"), [("nf4", 6.2484564781188965), ("fp4", 3.2500076293945312)])
def test_4bit_full_blocks_multiply_the_last_block_divides(quant_type, absmax):
    # (absmax values found by search: ones where both rules make ties the other does not)
    v = bitsandbytes._formats.code_table(quant_type, "cpu").float().sort().values
    check_4bit(on_midpoints((v[:-1] + v[1:]) / 2, 32, absmax), 32, quant_type)


@pytest.mark.parametrize("value", NONFINITE, ids=str)
@pytest.mark.parametrize("quant_type", QUANT_TYPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_4bit_nonfinite(dtype, quant_type, value):
    # 3 blocks and an odd tail of 5: the padding nibble keeps its code even in a poisoned last block.
    A = with_nonfinite(randn((3 * 64 + 5,), dtype, seed_of("nf4", dtype, value, quant_type)), 64, value)
    A = with_nonfinite(A, 64, value, block=3, offset=4)
    check_4bit(A, 64, quant_type)


@pytest.mark.parametrize("quant_type", QUANT_TYPES)
def test_4bit_all_zero_block(quant_type):
    check_4bit(with_zero_block(randn((3 * 64 + 5,), torch.float16, seed_of("z4", quant_type)), 64), 64, quant_type)


@pytest.mark.parametrize("storage", QUANT_STORAGE_DTYPES, ids=dtype_id)
def test_4bit_quant_storage(storage):
    A = randn((8, 32), torch.float16, seed_of("st", storage))
    check_4bit(A, 64, "nf4", storage=storage)


@pytest.mark.parametrize("shape", empty_shapes(), ids=str)
def test_4bit_empty(shape):
    check_4bit(torch.empty(shape, dtype=torch.float16), 64, "fp4")


# ------------------------------------------------------------------------------------------- both


@pytest.mark.parametrize("blocksize", [32, 256, 4096])
def test_grid_stride(monkeypatch, code, blocksize):
    """With the grid capped at 2 blocks, the kernels loop over the rest (as on a large tensor on a GPU)."""
    monkeypatch.setattr(quant, "MAX_GRID", 2)
    A = randn((7 * blocksize + 3,), torch.bfloat16, seed_of("stride", blocksize))
    check_blockwise(A, code, blocksize)
    check_4bit(A, blocksize, "nf4")


def test_geometry_meets_the_kernels_requirements():
    for n in (1, 1000, 10**9):
        for blocksize in BLOCKSIZES:
            grid, threads = quant.quantize_geometry(n, blocksize)
            group = blocksize // quant.ITEMS_PER_THREAD
            assert threads % 32 == 0 and threads % group == 0 and 256 <= threads <= 1024
            assert 1 <= grid <= quant.MAX_GRID
        grid, threads = quant.dequantize_geometry(n)
        assert 1 <= grid <= quant.MAX_GRID and threads == quant.THREADS


@pytest.mark.parametrize(
    ("op", "args"),
    [
        ("quantize_blockwise", lambda c: (torch.zeros(8), c, 0)),  # any positive size is valid
        ("quantize_blockwise", lambda c: (torch.zeros(8, dtype=torch.int32), c, 64)),
        ("quantize_blockwise", lambda c: (torch.zeros(8), c[:100], 64)),
        ("dequantize_blockwise", lambda c: (torch.zeros(8, dtype=torch.uint8), torch.zeros(2), c, 64, torch.float32)),
        ("quantize_4bit", lambda c: (torch.zeros(8), 64, "nf5", torch.uint8)),
        ("dequantize_4bit", lambda c: (torch.zeros(2, dtype=torch.uint8), torch.zeros(1), 64, "fp4", [8], torch.half)),
    ],
    ids=["blocksize", "A-dtype", "code-numel", "absmax-numel", "quant_type", "A-bytes"],
)
def test_errors_are_the_references(code, op, args):
    with pytest.raises((TypeError, ValueError)) as ref:
        REFERENCE[op](*args(code))
    with pytest.raises(type(ref.value), match=re.escape(str(ref.value))):
        getattr(quant, op)(*args(code))
