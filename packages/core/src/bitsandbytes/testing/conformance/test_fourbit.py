"""4-bit NF4/FP4 quantization and dequantization (the matmuls on the packed format: ``test_matmul_4bit``).

Bit-exact against the reference: packed bytes (whatever ``quant_storage``), absmax, dequantized values
(one fp32 product ``table[code] * absmax`` rounded once to the output dtype).
"""

from __future__ import annotations

from math import prod

import pytest
import torch

from bitsandbytes._reference import REFERENCE

from ..cases import (
    BLOCKSIZES,
    DTYPES,
    NONFINITE,
    QUANT_STORAGE_DTYPES,
    QUANT_TYPES,
    block_absmax,
    code_table_4bit,
    dtype_id,
    empty_shapes,
    on_midpoints,
    randn,
    seed_of,
    shapes_for_blocksize,
    to,
    unpack_4bit,
    with_nonfinite,
    with_zero_block,
)
from ..compare import (
    assert_all,
    assert_close,
    assert_equal,
    assert_equal_up_to_nan_payload,
    matmul_tolerance,  # noqa: F401  (backends' tests import it from here)
)
from ..samples import op_overload

OPS_TESTED = ("quantize_4bit", "dequantize_4bit", "dequantize_4bit.out")

CASES = [(d, b, s) for d in DTYPES for b in BLOCKSIZES for s in shapes_for_blocksize(b)[1:3]]
CASE_IDS = [f"{dtype_id(d)}-b{b}-{'x'.join(map(str, s))}" for d, b, s in CASES]


def quantize(A, blocksize, quant_type, device, storage=torch.uint8):
    packed, absmax = op_overload("quantize_4bit")(A.to(device), blocksize, quant_type, storage)
    rpacked, rabsmax = REFERENCE["quantize_4bit"](A.cpu(), blocksize, quant_type, storage)
    assert_equal(packed, rpacked, f"packed {quant_type} bytes vs reference")
    assert_equal(absmax, rabsmax, "absmax vs reference")
    return packed, absmax


def dequantize(packed, absmax, blocksize, quant_type, shape, dtype, device):
    out = op_overload("dequantize_4bit")(*to((packed, absmax), device), blocksize, quant_type, list(shape), dtype)
    ref = REFERENCE["dequantize_4bit"](*to((packed, absmax), "cpu"), blocksize, quant_type, list(shape), dtype)
    assert_equal(out, ref, "dequantized values vs reference")
    return out


@pytest.mark.parametrize("quant_type", QUANT_TYPES)
@pytest.mark.parametrize(("dtype", "blocksize", "shape"), CASES, ids=CASE_IDS)
def test_quantize(bnb_device, dtype, blocksize, shape, quant_type):
    A = randn(shape, dtype, seed_of("q4", dtype, blocksize, shape, quant_type))
    n = A.numel()
    packed, absmax = quantize(A, blocksize, quant_type, bnb_device)
    # Reference-free: packed shape, exact absmax, nearest-code rounding, round trip error.
    assert packed.dtype == torch.uint8 and tuple(packed.shape) == ((n + 1) // 2, 1)
    assert_equal(absmax, block_absmax(A, blocksize).float(), "absmax vs max |x| of each block")
    table = code_table_4bit(quant_type).double()
    scale = block_absmax(A, blocksize).repeat_interleave(blocksize)[:n]
    scaled = torch.where(scale > 0, A.double().reshape(-1) / scale, 0.0)
    dist = (scaled[:, None] - table[None, :]).abs()
    chosen = dist.gather(1, unpack_4bit(packed, n)[:, None]).squeeze(1)
    assert_all(chosen <= dist.min(dim=1).values + 2e-7, f"codes must be a nearest {quant_type} entry", chosen)
    out = dequantize(packed, absmax, blocksize, quant_type, shape, torch.float32, bnb_device)
    half_gap = (table.sort().values.diff().max() / 2).item()
    err = (out.cpu().double() - A.double()).abs().reshape(-1)
    assert_all(err <= scale * (half_gap + 2**-22), "round trip error within half a code gap times absmax", err)


@pytest.mark.parametrize("quant_type", QUANT_TYPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_dequantize(bnb_device, dtype, quant_type):
    for blocksize in BLOCKSIZES:
        g = torch.Generator().manual_seed(seed_of("d4", dtype, quant_type, blocksize))
        shape = (3, blocksize + 3)  # odd element count: the last byte is half used
        n = prod(shape)
        packed = torch.randint(0, 256, ((n + 1) // 2, 1), generator=g, dtype=torch.uint8)
        blocks = -(n // -blocksize)
        absmax = torch.rand(blocks, generator=g) * 10
        absmax[0] = 0.0
        out = dequantize(packed, absmax, blocksize, quant_type, shape, dtype, bnb_device)
        # Reference-free: table[code] * absmax in fp32, rounded once to dtype.
        table = code_table_4bit(quant_type)
        expected = (table[unpack_4bit(packed, n)] * absmax.repeat_interleave(blocksize)[:n]).to(dtype).view(shape)
        assert_equal(out, expected, f"b{blocksize}: dequantized vs table[code] * absmax")
        buf = torch.full(shape, float("nan"), dtype=dtype, device=bnb_device)
        op_overload("dequantize_4bit.out")(
            *to((packed, absmax), bnb_device), blocksize, quant_type, list(shape), dtype, buf
        )
        assert_equal(buf, out, f"b{blocksize}: .out vs functional")
        ref_buf = torch.empty(shape, dtype=dtype)
        REFERENCE["dequantize_4bit.out"](packed, absmax, blocksize, quant_type, list(shape), dtype, ref_buf)
        assert_equal(ref_buf, out.cpu(), f"b{blocksize}: reference .out vs functional")


@pytest.mark.parametrize(
    ("quant_type", "values", "first_byte"),
    [("nf4", [1.0, -1.0], 0xF0), ("nf4", [-1.0, 0.0], 0x07), ("fp4", [1.0, -1.0], 0x3B), ("fp4", [0.5, -0.25], 0x5F)],
)
def test_nibble_order(bnb_device, quant_type, values, first_byte):
    # Hand-computed: the first value sits in the high nibble. (NF4: 1.0 is code 15, -1.0 code 0,
    # 0.0 code 7; FP4: 1.0 = 12/12 is code 3, 0.5 = 6/12 code 5, bit 3 makes it negative.)
    A = torch.tensor(values + [1.0] * 30)
    packed, absmax = quantize(A, 32, quant_type, bnb_device)
    assert packed.view(-1)[0].item() == first_byte, f"first byte {packed.view(-1)[0].item():#04x}"
    out = dequantize(packed, absmax, 32, quant_type, A.shape, torch.float32, bnb_device)
    assert_equal(out.cpu()[:2], torch.tensor(values), "hand example round trip")


@pytest.mark.parametrize("storage", QUANT_STORAGE_DTYPES, ids=dtype_id)
def test_quant_storage(bnb_device, storage):
    A = randn((4, 64), torch.float16, seed_of("qs", storage))
    packed_u8, _ = quantize(A, 64, "nf4", bnb_device)
    packed, absmax = quantize(A, 64, "nf4", bnb_device, storage)
    # The storage dtype is only a view of the same bytes.
    assert packed.dtype == storage and tuple(packed.shape) == (128 // storage.itemsize, 1)
    assert_equal(packed.cpu().view(-1).view(torch.uint8), packed_u8.cpu().view(-1), "bytes in quant_storage")
    out = dequantize(packed, absmax, 64, "nf4", A.shape, torch.float16, bnb_device)
    assert_equal(out, dequantize(packed_u8, absmax, 64, "nf4", A.shape, torch.float16, bnb_device), "dequantized")


@pytest.mark.parametrize("quant_type", QUANT_TYPES)
def test_all_zero_block(bnb_device, quant_type):
    blocksize = 64
    A = with_zero_block(randn((3 * blocksize + 5,), torch.bfloat16, seed_of("z4", quant_type)), blocksize)
    packed, absmax = quantize(A, blocksize, quant_type, bnb_device)
    assert absmax[1].item() == 0.0
    out = dequantize(packed, absmax, blocksize, quant_type, A.shape, torch.bfloat16, bnb_device)
    assert_all(out.isfinite(), "no NaN/Inf anywhere", out)
    assert_all(out[blocksize : 2 * blocksize] == 0, "an all-zero block dequantizes to zeros", out)


@pytest.mark.parametrize("shape", empty_shapes(), ids=str)
def test_empty(bnb_device, shape):
    A = torch.empty(shape, dtype=torch.float32)
    packed, absmax = quantize(A, 64, "nf4", bnb_device)
    assert packed.numel() == 0 and absmax.numel() == 0
    out = dequantize(packed, absmax, 64, "nf4", shape, torch.float16, bnb_device)
    assert tuple(out.shape) == shape


@pytest.mark.parametrize("value", NONFINITE, ids=str)
@pytest.mark.parametrize("quant_type", QUANT_TYPES)
def test_nonfinite_input(bnb_device, quant_type, value):
    blocksize = 64
    A = with_nonfinite(randn((3 * blocksize + 5,), torch.float16, seed_of("n4", quant_type, value)), blocksize, value)
    packed, absmax = op_overload("quantize_4bit")(A.to(bnb_device), blocksize, quant_type, torch.uint8)
    _, rabsmax = REFERENCE["quantize_4bit"](A, blocksize, quant_type, torch.uint8)
    assert not absmax[1].isfinite().item(), "a non-finite value makes its block's absmax non-finite"
    assert_close(absmax, rabsmax, "absmax vs reference", rtol=0, atol=0)
    out = op_overload("dequantize_4bit")(packed, absmax, blocksize, quant_type, list(A.shape), torch.float16).cpu()
    keep = torch.ones(A.numel(), dtype=torch.bool)
    keep[blocksize : 2 * blocksize] = False
    assert_all(~out[~keep].isfinite(), "the block dequantizes to non-finite values", out[~keep])
    assert_all(out[keep].isfinite(), "the other blocks stay finite", out)
    # Outside the poisoned block the bytes are the format's (and 2 codes share a byte, hence // 2).
    r_out = REFERENCE["dequantize_4bit"](
        *REFERENCE["quantize_4bit"](A, blocksize, quant_type, torch.uint8),
        blocksize,
        quant_type,
        list(A.shape),
        torch.float16,
    )
    assert_equal(out[keep], r_out[keep], "dequantized finite blocks vs reference")


# Edge cases of the nearest-code search and of the scaling rules: every result is compared with the
# reference's bytes; only a NaN's payload is free.


def check_4bit(A, blocksize, quant_type, device, storage=torch.uint8):
    packed, absmax = op_overload("quantize_4bit")(A.to(device), blocksize, quant_type, storage)
    rpacked, rabsmax = REFERENCE["quantize_4bit"](A.cpu(), blocksize, quant_type, storage)
    assert_equal(packed, rpacked, f"packed {quant_type} bytes vs reference")
    assert_equal_up_to_nan_payload(absmax, rabsmax, "absmax vs reference")
    out = op_overload("dequantize_4bit")(packed, absmax, blocksize, quant_type, list(A.shape), A.dtype)
    ref = REFERENCE["dequantize_4bit"](rpacked, rabsmax, blocksize, quant_type, list(A.shape), A.dtype)
    assert_equal_up_to_nan_payload(out, ref, "dequantized values vs reference")


@pytest.mark.parametrize("quant_type", QUANT_TYPES)
def test_ties_and_signed_zeros(bnb_device, quant_type):
    """Values on every midpoint of the table and just above it, +-0 and the smallest values either side
    of 0 (FP4 splits its two zero codes at 0)."""
    v = code_table_4bit(quant_type).sort().values
    mids = (v[:-1] + v[1:]) / 2
    tiny = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 2e-3, -2e-3])
    A = torch.cat([torch.ones(1), mids, v, tiny, torch.nextafter(mids, torch.ones(1)), -torch.ones(1)])
    check_4bit(A, 64, quant_type, bnb_device)


@pytest.mark.parametrize(("quant_type", "absmax"), [("nf4", 6.2484564781188965), ("fp4", 3.2500076293945312)])
def test_full_blocks_multiply_the_last_block_divides(bnb_device, quant_type, absmax):
    # (absmax values found by search: ones where both rules make ties the other does not)
    v = code_table_4bit(quant_type).sort().values
    check_4bit(on_midpoints((v[:-1] + v[1:]) / 2, 32, absmax), 32, quant_type, bnb_device)


@pytest.mark.parametrize("value", NONFINITE, ids=str)
@pytest.mark.parametrize("quant_type", QUANT_TYPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_nonfinite_in_the_short_last_block(bnb_device, dtype, quant_type, value):
    # 3 blocks and an odd tail of 5: the padding nibble keeps its code even in a poisoned last block.
    A = with_nonfinite(randn((3 * 64 + 5,), dtype, seed_of("nf4", dtype, value, quant_type)), 64, value)
    check_4bit(with_nonfinite(A, 64, value, block=3, offset=4), 64, quant_type, bnb_device)
