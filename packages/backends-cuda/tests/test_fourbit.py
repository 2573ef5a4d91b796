"""The fourbit family's CUDA kernels (csrc/kernels/fourbit.cu), run in the emulator against the reference.

Packed codes, absmax and dequantized values are compared bit for bit, as in test_blockwise.py (only the
payload of a dequantized NaN is free). The op functions of ``bitsandbytes_cuda.ops.fourbit`` are called
directly on CPU tensors with ``launch`` in emulator mode.
"""

from __future__ import annotations

import pytest
import torch
from bitexact import check_4bit, check_blockwise, on_midpoints, raises_as_the_reference

import bitsandbytes
from bitsandbytes._reference import REFERENCE
from bitsandbytes.testing.cases import (
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
from bitsandbytes_cuda.ops import blockwise, fourbit

CASES = list(blockwise_cases())
CASE_IDS = [f"{dtype_id(d)}-b{b}-{'x'.join(map(str, s))}" for d, b, s in CASES]


pytestmark = pytest.mark.usefixtures("emulated")  # conftest: launch() in the emulator


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


@pytest.mark.parametrize("blocksize", [32, 256, 4096])
def test_grid_stride(monkeypatch, code, blocksize):
    """With the grid capped at 2 blocks, the kernels loop over the rest (as on a large tensor on a GPU)."""
    monkeypatch.setattr(blockwise, "MAX_GRID", 2)  # the geometry of both families
    A = randn((7 * blocksize + 3,), torch.bfloat16, seed_of("stride", blocksize))
    check_blockwise(A, code, blocksize)
    check_4bit(A, blocksize, "nf4")


@pytest.mark.parametrize(
    ("op", "args"),
    [
        ("quantize_4bit", (torch.zeros(8), 64, "nf5", torch.uint8)),
        ("dequantize_4bit", (torch.zeros(2, dtype=torch.uint8), torch.zeros(1), 64, "fp4", [8], torch.half)),
    ],
    ids=["quant_type", "A-bytes"],
)
def test_errors_are_the_references(op, args):
    raises_as_the_reference(op, getattr(fourbit, op), args)
