"""On a real GPU: the 4-bit matmuls at decoding-sized shapes the conformance cases do not reach (K in the
thousands, every kernel path, M across the fused / GEMM crossover), against the reference on the CPU
within the conformance suite's tolerance; and the same bytes on a side stream."""

from __future__ import annotations

import pytest
import torch

from bitsandbytes import _formats
from bitsandbytes._reference import REFERENCE
from bitsandbytes.testing.conformance.test_fourbit import matmul_tolerance
from bitsandbytes_cuda.ops import matmul_4bit as ops

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")


def _weight(N, K, blocksize, quant_type, seed=0):
    g = torch.Generator().manual_seed(seed)
    packed, absmax = REFERENCE["quantize_4bit"](torch.randn(N, K, generator=g), blocksize, quant_type, torch.uint8)
    W64 = REFERENCE["dequantize_4bit"](packed, absmax, blocksize, quant_type, [N, K], torch.float32).double()
    return packed, absmax, W64


def _check(out, ref, A, W64):
    out, ref = out.cpu(), ref.cpu()
    assert out.dtype == ref.dtype and out.shape == ref.shape
    diff = (out.double() - ref.double()).abs()
    assert (diff <= matmul_tolerance(A.cpu(), W64, ref)).all(), diff.max()


# (M, N, K): 16-byte path with many steps per lane; K % 32 != 0 (4-byte path); K % 8 != 0 (any path); odd
# K; several tiles of 8 rows; M on both sides of every entry of ops.FUSED_MAX_ROWS (16 to 64), the GEMM path.
SHAPES = [
    (1, 1000, 4096),
    (1, 96, 14336),
    (2, 77, 4104),
    (4, 333, 4100),
    (8, 64, 1001),
    (3, 257, 11008),
    (12, 300, 4096),
    (16, 300, 2048),
    (17, 40, 1024),
    (33, 50, 2048),
    (64, 128, 512),
    (65, 64, 512),
]


@pytest.mark.parametrize(("M", "N", "K"), SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_gemv_4bit_on_gpu(dtype, M, N, K):
    packed, absmax, W64 = _weight(N, K, 64, "nf4")
    A = torch.randn(M, K, generator=torch.Generator().manual_seed(1)).to(dtype)
    code = _formats.code_table("nf4", "cpu").float()
    args = (A, packed, [N, K], absmax, code, 64)
    out = ops.gemv_4bit(*(a.cuda() if isinstance(a, torch.Tensor) else a for a in args))
    _check(out, REFERENCE["gemv_4bit"](*args), A, W64)


@pytest.mark.parametrize("M", [1, 2, 24, 80])
def test_gemm_4bit_nested_bias_on_gpu(M):
    N, K = 200, 1024
    packed, absmax, W64 = _weight(N, K, 64, "fp4", seed=2)
    dyn = torch.linspace(-1, 1, 256)
    offset = absmax.mean()
    q, absmax2 = REFERENCE["quantize_blockwise"](absmax - offset, dyn, 256)
    effective = REFERENCE["dequantize_blockwise"](q, absmax2, dyn, 256, torch.float32) + offset
    W64 = REFERENCE["dequantize_4bit"](packed, effective, 64, "fp4", [N, K], torch.float32).double()
    A = torch.randn(M, K, generator=torch.Generator().manual_seed(3)).half()
    bias = torch.randn(N).half()
    args = (A, packed, [N, K], absmax2, 64, "fp4")
    kw = {"bias": bias, "absmax_8bit": q, "absmax_code": dyn, "absmax_offset": offset.reshape(1)}
    out = ops.gemm_4bit(
        *(a.cuda() if isinstance(a, torch.Tensor) else a for a in args), **{k: v.cuda() for k, v in kw.items()}
    )
    _check(out, REFERENCE["gemm_4bit"](*args, **kw), A, W64)


@pytest.mark.parametrize("M", [1, 5, 80])
def test_nested_scales_decoded_in_the_kernels_are_the_references(M):
    """Nested scales decoded inside the kernels (nvcc's code: any FMA contraction of code8 * absmax2 + offset
    would show) give exactly the output of the plain scales the reference expands them to."""
    N, K = 96, 8192
    packed, absmax, _ = _weight(N, K, 64, "nf4", seed=5)
    code8 = torch.sort(torch.rand(256, generator=torch.Generator().manual_seed(6)) * 2 - 1).values ** 3
    offset = absmax.mean() + 0.01
    q, absmax2 = REFERENCE["quantize_blockwise"](absmax - offset, code8, 256)
    effective = REFERENCE["dequantize_blockwise"](q, absmax2, code8, 256, torch.float32) + offset
    A = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    cuda = [t.cuda() for t in (packed, absmax2, q, code8, offset.reshape(1), effective)]
    packed, absmax2, q, code8, offset, effective = cuda
    kw = {"absmax_8bit": q, "absmax_code": code8, "absmax_offset": offset}
    nested = ops.gemm_4bit(A, packed, [N, K], absmax2, 64, "nf4", **kw)
    assert torch.equal(nested, ops.gemm_4bit(A, packed, [N, K], effective, 64, "nf4"))


def test_side_stream_gives_the_same_bytes():
    packed, absmax, _ = _weight(512, 4096, 64, "nf4", seed=4)
    packed, absmax = packed.cuda(), absmax.cuda()
    A = torch.randn(2, 4096, device="cuda", dtype=torch.bfloat16)
    expected = ops.gemm_4bit(A, packed, [512, 4096], absmax, 64, "nf4")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = ops.gemm_4bit(A, packed, [512, 4096], absmax, 64, "nf4")
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(got, expected)
