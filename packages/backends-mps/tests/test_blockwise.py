"""metal/blockwise.metal's kernels run in the emulator against the reference: 8-bit blockwise quantization.

Codes, absmax and dequantized values are bytes the format defines, so the comparisons are bit-exact (only
the payload of a dequantized NaN is free). The op functions of ``bitsandbytes_mps.ops.blockwise`` are
called directly on CPU tensors with the library in emulator mode; the conformance suite runs them through
``bitsandbytes_mps.testing.emulated``. Also checked: the quantizers' geometry constants shared by
metal/quantize.h and the ops.
"""

from __future__ import annotations

import re

import pytest
import torch
from quant_checks import CASE_IDS, CASES, check_blockwise, on_midpoints

from bitsandbytes import functional
from bitsandbytes._reference import REFERENCE
from bitsandbytes.testing.cases import (
    BLOCKSIZES,
    DTYPES,
    NONFINITE,
    dtype_id,
    empty_shapes,
    randn,
    seed_of,
    with_nonfinite,
    with_zero_block,
)
from bitsandbytes.testing.compare import assert_equal
from bitsandbytes_mps import _assemble
from bitsandbytes_mps.ops import _quantize, blockwise
from bitsandbytes_mps.tables import _quantize as geometry
from bitsandbytes_mps.tables import blockwise as table

pytestmark = pytest.mark.usefixtures("emulated")  # conftest: the library loads in the emulator

# --------------------------------------------------------------------------------- the source itself


def test_geometry_constants_match_quantize_h():
    text = _assemble.source_path("quantize.h").read_text()
    for macro, value in (("BNB_QUANT_ITEMS", geometry.QUANT_ITEMS), ("BNB_DEQUANT_ITEMS", geometry.DEQUANT_ITEMS)):
        assert re.search(rf"#define {macro} {value}\n", text), macro


def test_quantize_geometry_meets_the_kernels_requirements():
    for n in (1, 1000, 10**9):
        for blocksize in BLOCKSIZES:
            threads, size = _quantize.quantize_geometry(n, blocksize)
            group = blocksize // geometry.QUANT_ITEMS
            assert size % 32 == 0 and size % group == 0 and 256 <= size <= 1024 and threads % size == 0
            assert (threads // size) * (size // group) * blocksize >= n  # every block has its threads


# ------------------------------------------------------------------------------------------- 8-bit


@pytest.mark.parametrize(("dtype", "blocksize", "shape"), CASES, ids=CASE_IDS)
def test_blockwise_matches_reference(code, dtype, blocksize, shape):
    check_blockwise(randn(shape, dtype, seed_of("q8", dtype, blocksize, shape)), code, blocksize)


@pytest.mark.parametrize("out_dtype", DTYPES, ids=dtype_id)
def test_blockwise_dequantize_to_other_dtypes_and_out(code, out_dtype):
    A = randn((3, 69), torch.float32, seed_of("q8o", out_dtype))
    q, absmax = blockwise.quantize_blockwise(A, code, 64)
    ref = REFERENCE["dequantize_blockwise"](q, absmax, code, 64, out_dtype)
    assert_equal(blockwise.dequantize_blockwise(q, absmax, code, 64, out_dtype), ref, "dequantized")
    out = torch.full(A.shape, float("nan"), dtype=out_dtype)
    assert blockwise.dequantize_blockwise_out(q, absmax, code, 64, out_dtype, out) is None
    assert_equal(out, ref, "dequantized into out")
    with pytest.raises(ValueError, match="out must be contiguous"):
        blockwise.dequantize_blockwise_out(
            q, absmax, code, 64, out_dtype, torch.empty((3, 138), dtype=out_dtype)[:, ::2]
        )


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
    check_blockwise(randn((5 * 128 + 9,), torch.float32, seed_of("unsorted")), shuffled, 128)


def test_blockwise_unsigned_and_linear_maps():
    A = randn((2 * 64 + 3,), torch.float16, seed_of("maps"))
    check_blockwise(A.abs(), functional.create_dynamic_map(signed=False).float(), 64)
    check_blockwise(A, torch.linspace(-1, 1, 256), 64)


@pytest.mark.parametrize("nan_at", [0, 5, 200, 255])
def test_blockwise_map_with_a_nan_entry(code, nan_at):
    """A NaN map entry sorts after every number, and the NaN midpoints next to it are searched as the
    reference's bucketize searches them (it goes right at a NaN boundary): the same codes."""
    with_nan = code.clone()
    with_nan[nan_at] = float("nan")
    A = randn((16 * 256 + 77,), torch.float32, seed_of("nan map", nan_at))
    A[7] = float("nan")
    check_blockwise(A, with_nan, 256)


def test_prepared_map_is_the_reference_sort(code):
    g = torch.Generator().manual_seed(3)
    shuffled = code[torch.randperm(256, generator=g)].contiguous()
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
def test_blockwise_empty(code, shape, dispatched):
    check_blockwise(torch.empty(shape), code, 64)
    assert dispatched == []  # Metal cannot bind an empty buffer: nothing is launched


# ------------------------------------------------------------------------------------ errors, fallback


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
    with pytest.raises((TypeError, ValueError)) as ref:
        REFERENCE[op](*args(code))
    with pytest.raises(type(ref.value), match=re.escape(str(ref.value))):
        blockwise.OPS[op](*args(code))


def test_missing_bfloat_kernels_fall_back_to_the_reference(monkeypatch, code, dispatched):
    """Where MSL < 3.1 the bf16 instances are absent: those ops run the reference, the others stay native."""
    real = _quantize.native
    monkeypatch.setattr(_quantize, "native", lambda name, threads=0: not name.endswith("_bf16") and real(name, threads))
    A = randn((2, 70), torch.bfloat16, seed_of("fallback"))
    check_blockwise(A, code, 64)
    assert dispatched == []
    check_blockwise(A.float(), code, 64)
    assert dispatched  # float32 still runs its kernels


def test_ops_table():
    assert set(blockwise.OPS) == {"quantize_blockwise", "dequantize_blockwise", "dequantize_blockwise.out"}
    assert blockwise.SOURCES == (table.SOURCE,)
