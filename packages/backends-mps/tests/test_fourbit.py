"""metal/fourbit.metal's kernels run in the emulator against the reference: 4-bit NF4/FP4 quantization.

Packed codes, absmax and dequantized values are bytes the formats define, so the comparisons are
bit-exact (only the payload of a dequantized NaN is free). The op functions of
``bitsandbytes_mps.ops.fourbit`` are called directly on CPU tensors with the library in emulator mode; the
conformance suite runs them through ``bitsandbytes_mps.testing.emulated``.
"""

from __future__ import annotations

import re

import pytest
import torch
from quant_checks import CASE_IDS, CASES, check_4bit, check_blockwise, on_midpoints

from bitsandbytes import _formats
from bitsandbytes._reference import REFERENCE
from bitsandbytes.testing.cases import (
    DTYPES,
    NONFINITE,
    QUANT_STORAGE_DTYPES,
    QUANT_TYPES,
    dtype_id,
    empty_shapes,
    randn,
    seed_of,
    with_nonfinite,
    with_zero_block,
)
from bitsandbytes.testing.compare import assert_equal
from bitsandbytes_mps.ops import _quantize, fourbit
from bitsandbytes_mps.tables import fourbit as table

pytestmark = pytest.mark.usefixtures("emulated")  # conftest: the library loads in the emulator


@pytest.mark.parametrize("quant_type", QUANT_TYPES)
@pytest.mark.parametrize(("dtype", "blocksize", "shape"), CASES, ids=CASE_IDS)
def test_4bit_matches_reference(dtype, blocksize, shape, quant_type):
    check_4bit(randn(shape, dtype, seed_of("q4", dtype, blocksize, shape, quant_type)), blocksize, quant_type)


@pytest.mark.parametrize("quant_type", QUANT_TYPES)
@pytest.mark.parametrize("out_dtype", DTYPES, ids=dtype_id)
def test_4bit_dequantize_to_other_dtypes_and_out(out_dtype, quant_type):
    A = randn((4, 51), torch.bfloat16, seed_of("q4o", out_dtype, quant_type))
    packed, absmax = fourbit.quantize_4bit(A, 32, quant_type, torch.uint8)
    ref = REFERENCE["dequantize_4bit"](packed, absmax, 32, quant_type, [4, 51], out_dtype)
    out = torch.full((4, 51), float("nan"), dtype=out_dtype)
    assert fourbit.dequantize_4bit_out(packed, absmax, 32, quant_type, [4, 51], out_dtype, out) is None
    assert_equal(out, ref, "dequantized into out")
    with pytest.raises(ValueError, match="out must be contiguous"):
        fourbit.dequantize_4bit_out(
            packed, absmax, 32, quant_type, [4, 51], out_dtype, torch.empty((51, 4), dtype=out_dtype).T
        )


@pytest.mark.parametrize("quant_type", QUANT_TYPES)
def test_4bit_ties_and_signed_zeros(quant_type):
    """Values on every midpoint of the table, +-0 and the smallest values either side of 0 (FP4 splits
    its two zero codes at 0)."""
    v = _formats.code_table(quant_type).float().sort().values
    mids = (v[:-1] + v[1:]) / 2
    tiny = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 2e-3, -2e-3])
    A = torch.cat([torch.ones(1), mids, v, tiny, torch.nextafter(mids, torch.ones(1)), torch.ones(1) * -1])
    check_4bit(A, 64, quant_type)


@pytest.mark.parametrize(("quant_type", "absmax"), [("nf4", 6.2484564781188965), ("fp4", 3.2500076293945312)])
def test_4bit_full_blocks_multiply_the_last_block_divides(quant_type, absmax):
    v = _formats.code_table(quant_type).float().sort().values
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
    check_4bit(randn((8, 32), torch.float16, seed_of("st", storage)), 64, "nf4", storage=storage)


def test_blocks_below_min_scale(code):
    """Blocks whose absmax is under MIN_SCALE (subnormal values, signed zeros) in a full and the short
    last block: the kernels' bit-decided tiny-block path gives the reference's codes."""
    tiny = torch.tensor([1e-39, -3e-39, 0.0, -0.0, 5e-40, 1e-45, -1e-45, 2e-39])
    A = torch.cat([tiny.repeat(8), tiny[:5], torch.zeros(64 - 5 - 64 % 64), -tiny[:7]])
    check_blockwise(A, code, 64)
    for quant_type in QUANT_TYPES:
        check_4bit(A, 64, quant_type)


@pytest.mark.parametrize("shape", empty_shapes(), ids=str)
def test_4bit_empty(shape, dispatched):
    check_4bit(torch.empty(shape, dtype=torch.float16), 64, "fp4")
    assert dispatched == []


@pytest.mark.parametrize("blocksize", [32, 4096])
def test_many_threadgroups(code, blocksize):
    """Enough blocks for several threadgroups, and a last threadgroup with idle block slots."""
    A = randn((9 * blocksize + 3,), torch.bfloat16, seed_of("groups", blocksize))
    check_blockwise(A, code, blocksize)
    check_4bit(A, blocksize, "nf4")


# ------------------------------------------------------------------------------------ errors, fallback


@pytest.mark.parametrize(
    ("op", "args"),
    [
        ("quantize_4bit", (torch.zeros(8), 64, "nf5", torch.uint8)),
        ("dequantize_4bit", (torch.zeros(2, dtype=torch.uint8), torch.zeros(1), 64, "fp4", [8], torch.half)),
    ],
    ids=["quant_type", "A-bytes"],
)
def test_errors_are_the_references(op, args):
    with pytest.raises((TypeError, ValueError)) as ref:
        REFERENCE[op](*args)
    with pytest.raises(type(ref.value), match=re.escape(str(ref.value))):
        fourbit.OPS[op](*args)


def test_missing_bfloat_kernels_fall_back_to_the_reference(monkeypatch, dispatched):
    """Where MSL < 3.1 the bf16 instances are absent: those ops run the reference, the others stay native."""
    real = _quantize.native
    monkeypatch.setattr(_quantize, "native", lambda name, threads=0: not name.endswith("_bf16") and real(name, threads))
    A = randn((2, 70), torch.bfloat16, seed_of("fallback"))
    check_4bit(A, 64, "nf4")
    assert dispatched == []
    check_4bit(A.float(), 64, "nf4")
    assert dispatched  # float32 still runs its kernels


def test_ops_table():
    assert set(fourbit.OPS) == {"quantize_4bit", "dequantize_4bit", "dequantize_4bit.out"}
    assert fourbit.SOURCES == (table.SOURCE,)
