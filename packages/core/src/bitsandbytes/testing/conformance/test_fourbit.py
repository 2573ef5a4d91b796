"""4-bit NF4/FP4 quantization, dequantization and the matmuls on the packed format.

Bit-exact against the reference: packed bytes (whatever ``quant_storage``), absmax, dequantized values
(one fp32 product ``table[code] * absmax`` rounded once to the output dtype).

Tolerance, ``gemv_4bit`` and ``gemm_4bit`` only: a kernel may sum the K products in any order, in
fp32, and may multiply by the fp32 weight ``table[code] * absmax`` instead of the weight rounded to
A's dtype. With ``S = |A| @ |W|.T`` (the sum of the magnitudes of the products) the allowed
difference is ``eps(dtype) * (|ref| + 2 S) + 2 sqrt(K) eps(fp32) S``: the final rounding to A's dtype,
the rounding of the weight to A's dtype, and fp32 accumulation in a different order.
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
    randn,
    seed_of,
    shapes_for_blocksize,
    to,
    unpack_4bit,
    with_nonfinite,
    with_zero_block,
)
from ..compare import assert_all, assert_close, assert_equal
from ..samples import op_overload

OPS_TESTED = ("quantize_4bit", "dequantize_4bit", "dequantize_4bit.out", "gemv_4bit", "gemv_4bit.out", "gemm_4bit")

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


def matmul_tolerance(A: torch.Tensor, W: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """The allowed |difference| per output element (see the module docstring)."""
    S = A.double().abs() @ W.double().abs().T
    K = A.shape[-1]
    eps = torch.finfo(A.dtype).eps
    return eps * (ref.double().abs() + 2 * S) + 2 * K**0.5 * torch.finfo(torch.float32).eps * S


def assert_matmul_close(out, ref, A, W, what):
    out, ref = out.cpu(), ref.cpu()
    assert out.dtype == ref.dtype == A.dtype and out.shape == ref.shape, f"{what}: {out.dtype}{tuple(out.shape)}"
    diff = (out.double() - ref.double()).abs()
    assert_all(diff <= matmul_tolerance(A, W, ref), f"{what}: |out - expected| within the stated tolerance", diff)


def weight(N, K, blocksize, quant_type, device, seed):
    """A quantized [N, K] weight: (packed, absmax, the exact dequantized weight in float64)."""
    Wf = randn((N, K), torch.float32, seed, spread=False)
    packed, absmax = quantize(Wf, blocksize, quant_type, device)
    table = code_table_4bit(quant_type).double()
    W64 = (table[unpack_4bit(packed, N * K)] * absmax.cpu().double().repeat_interleave(blocksize)[: N * K]).view(N, K)
    return packed, absmax, W64


GEMV_CASES = [((1, 64), 7), ((1, 1, 200), 33), ((200,), 5), ((3, 96), 10)]


@pytest.mark.parametrize(("a_shape", "N"), GEMV_CASES, ids=str)
@pytest.mark.parametrize("quant_type", QUANT_TYPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_gemv_4bit(bnb_device, dtype, quant_type, a_shape, N):
    K, blocksize = a_shape[-1], 64
    packed, absmax, W64 = weight(N, K, blocksize, quant_type, bnb_device, seed_of("gv", dtype, quant_type, a_shape))
    A = randn(a_shape, dtype, seed_of("gva", dtype, a_shape), spread=False)
    code = code_table_4bit(quant_type)
    args = (A, packed, [N, K], absmax, code, blocksize)
    out = op_overload("gemv_4bit")(*to(args, bnb_device))
    ref = REFERENCE["gemv_4bit"](*to(args, "cpu"))
    assert_matmul_close(out, ref, A, W64, "gemv vs reference")
    # Reference-free: against float64 math on the exactly dequantized weight.
    truth = (A.double() @ W64.T).to(dtype)
    assert_matmul_close(out, truth, A, W64, "gemv vs float64 A @ W.T")
    buf = torch.full(out.shape, float("nan"), dtype=dtype, device=bnb_device)
    op_overload("gemv_4bit.out")(*to(args, bnb_device), buf)
    assert_equal(buf, out, ".out vs functional")
    ref_buf = torch.empty(out.shape, dtype=dtype)
    REFERENCE["gemv_4bit.out"](*to(args, "cpu"), ref_buf)
    assert_equal(ref_buf, ref, "reference .out vs functional")


@pytest.mark.parametrize("nested", [False, True], ids=["plain", "double-quant"])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("quant_type", QUANT_TYPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_gemm_4bit(bnb_device, dtype, quant_type, bias, nested):
    N, K, blocksize = 40, 96, 32
    seed = seed_of("gm", dtype, quant_type, bias, nested)
    packed, absmax, W64 = weight(N, K, blocksize, quant_type, bnb_device, seed)
    A = randn((2, 3, K), dtype, seed + 1, spread=False)
    kwargs = {"bias": randn((N,), dtype, seed + 2, spread=False)} if bias else {}
    if nested:
        # Double quantization of the block scales: 8-bit codes, fp32 scale per 256 codes, and the mean.
        from bitsandbytes import functional

        dyn = functional.create_dynamic_map(signed=True).float()
        offset = absmax.cpu().mean()
        absmax_8bit, absmax2 = REFERENCE["quantize_blockwise"](absmax.cpu() - offset, dyn, 256)
        effective = (dyn[absmax_8bit.long()] * absmax2.repeat_interleave(256)[: absmax.numel()] + offset).double()
        table = code_table_4bit(quant_type).double()
        W64 = (table[unpack_4bit(packed, N * K)] * effective.repeat_interleave(blocksize)[: N * K]).view(N, K)
        kwargs |= {"absmax_8bit": absmax_8bit, "absmax_code": dyn, "absmax_offset": offset.reshape(1)}
        absmax = absmax2
    args = (A, packed, [N, K], absmax, blocksize, quant_type)
    out = op_overload("gemm_4bit")(*to(args, bnb_device), **to(kwargs, bnb_device))
    ref = REFERENCE["gemm_4bit"](*to(args, "cpu"), **to(kwargs, "cpu"))
    assert_matmul_close(out, ref, A, W64, "gemm vs reference")
    truth = A.double() @ W64.T + (kwargs["bias"].double() if bias else 0)
    assert_matmul_close(out, truth.to(dtype), A, W64, "gemm vs float64 A @ W.T (+ bias)")


@pytest.mark.parametrize("offset_dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
def test_gemm_4bit_casts_a_half_precision_offset_to_float32(bnb_device, offset_dtype):
    """Upstream casts absmax_offset to float32: the result is the one with offset.float()."""
    from bitsandbytes import functional

    N, K, blocksize = 40, 96, 32
    packed, absmax, _ = weight(N, K, blocksize, "nf4", bnb_device, seed_of("gmo", offset_dtype))
    A = randn((3, K), torch.float32, seed_of("gmo-A", offset_dtype), spread=False)
    dyn = functional.create_dynamic_map(signed=True).float()
    offset = absmax.cpu().mean().reshape(1).to(offset_dtype)
    absmax_8bit, absmax2 = REFERENCE["quantize_blockwise"](absmax.cpu() - offset.float(), dyn, 256)
    args = (A, packed, [N, K], absmax2, blocksize, "nf4")
    kwargs = {"absmax_8bit": absmax_8bit, "absmax_code": dyn}
    out = op_overload("gemm_4bit")(*to(args, bnb_device), **to(kwargs | {"absmax_offset": offset}, bnb_device))
    ref = op_overload("gemm_4bit")(*to(args, bnb_device), **to(kwargs | {"absmax_offset": offset.float()}, bnb_device))
    assert_equal(out, ref, "fp16/bf16 offset vs the same offset in float32")
