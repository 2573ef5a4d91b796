"""The matmuls on the packed 4-bit format: ``gemv_4bit`` (and its ``.out``) and ``gemm_4bit``.

Tolerance: a kernel may sum the K products in any order, in fp32, and may multiply by the fp32
weight ``table[code] * absmax`` instead of the weight rounded to A's dtype; the bound is
``compare.matmul_tolerance``. Each result is also checked against float64 math on the exactly
dequantized weight, so the reference run against itself cannot pass by definition.
"""

from __future__ import annotations

import pytest
import torch

from bitsandbytes._reference import REFERENCE

from ..cases import DTYPES, QUANT_TYPES, code_table_4bit, dtype_id, randn, seed_of, to, unpack_4bit
from ..compare import assert_all, assert_equal, matmul_tolerance
from ..samples import op_overload
from .test_fourbit import quantize

OPS_TESTED = ("gemv_4bit", "gemv_4bit.out", "gemm_4bit")


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
